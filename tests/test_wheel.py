"""The distribution as a user gets it: `python -m build`, then the wheel in fresh virtualenvs.

* The sdist and the wheel carry complete metadata (license, classifiers, keywords, the
  extras; no URLs until calibd has a public home) and the wheel holds the package ``calibd`` and nothing named ``app``.
* A server install: the wheel with ``[server,postgres]`` in a fresh venv. So that the test does
  not download the server's stack again, the venv sees the test environment's site-packages
  through a ``.pth`` line and pip runs with ``--no-index``: pip must find every requirement of
  the extras already there, and installs calibd alone. ``calibd --version``, ``calibd serve``,
  a fit and a calibrate run against it; from a folder outside the repository, ``import calibd``
  works and ``import app`` fails.
* A client-only install: the wheel with its base requirements alone (httpx, numpy, orjson) in
  another fresh venv, from the local package index. ``calibd serve`` says in one line to
  install ``calibd[server]``, and the tutorial's Python client section (docs/tutorial.md) runs as written against
  the server above.
"""

from __future__ import annotations

import email.parser
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

import calibd

from .conftest import REPO
from .processes import free_port, stop, wait_ready

pytestmark = pytest.mark.slow

#: The local package index (pip's configured extra index here); the client venv installs from it.
LOCAL_INDEX = os.environ.get("CALIBD_TEST_INDEX_URL", "file:///opt/pypi/simple")


def run(*command: str | Path, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return result


def pip(venv: Path, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """The test environment's pip, installing into ``venv`` (a venv made without pip: faster)."""
    return run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet",
               "--disable-pip-version-check", *arguments, cwd=cwd)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build requirements (setuptools) are the test environment's, not downloaded.
    result = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO, cwd=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("calibd-*.whl")
    return wheel


def test_the_sdist_and_the_wheel_carry_complete_metadata(dist):
    wheel = wheel_of(dist)
    (sdist,) = dist.glob("calibd-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.parser.Parser().parsestr(archive.read(f"calibd-{calibd.__version__}.dist-info/METADATA").decode())
    assert metadata["Name"] == "calibd" and metadata["Version"] == calibd.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # calibd has no public home yet: the metadata names no URL rather than made-up ones (pyproject.toml).
    assert metadata.get_all("Project-URL") is None
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and any(c.startswith("Topic ::") for c in classifiers)
    assert "calibration" in metadata["Keywords"].split(",")
    assert metadata["Requires-Python"] == ">=3.11"
    assert {"server", "postgres", "client", "streams", "spark", "docs", "test"} <= set(metadata.get_all("Provides-Extra"))
    base = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(re.split(r"[<>=\[; ]", r)[0] for r in base) == ["httpx", "numpy", "orjson"]  # the light install
    server = [r for r in metadata.get_all("Requires-Dist") if 'extra == "server"' in r]
    assert any(r.startswith("fastapi") for r in server) and any(r.startswith("redis") for r in server)
    assert any(r.startswith("psycopg") and 'extra == "postgres"' in r for r in metadata.get_all("Requires-Dist"))
    # The package is calibd, with its migrations, the compiled kernels and the gRPC descriptor; no app/.
    tops = {n.split("/")[0] for n in names}
    assert tops == {"calibd", f"calibd-{calibd.__version__}.dist-info"}, tops
    assert "calibd/migrations/versions/0001_calibrators_and_versions.py" in names
    assert "calibd/grpc_v2/grpc_predict_v2.pb" in names
    assert any(n.startswith("calibd/calibration/_kernels") and n.endswith(".so") for n in names)
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "setup.py", "LICENSE", "README.md", "app/calibration/_kernels.c", "migrations/env.py"} <= members


@pytest.fixture(scope="module")
def server_install(dist, tmp_path_factory) -> Path:
    """A venv with the wheel and [server,postgres], its requirements resolved --no-index against the
    test environment's packages (seen through a .pth line)."""
    home = tmp_path_factory.mktemp("server-venv")
    venv = home / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=home).returncode == 0
    site = Path(run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=home).stdout.strip())
    (site / "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = pip(venv, "--no-index", f"{wheel_of(dist)}[server,postgres]", cwd=home)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (site / "calibd" / "__init__.py").exists()  # calibd itself was installed into this venv
    return venv


@pytest.fixture(scope="module")
def served(server_install, tmp_path_factory):
    """`calibd serve` from the installed wheel, on SQLite in a folder outside the repository."""
    home = tmp_path_factory.mktemp("served")
    port = free_port()
    log = home / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen([server_install / "bin" / "calibd", "serve", "--port", str(port)], cwd=home,
                                   env=clean_env(), stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url + "/readyz", 60, "calibd serve (the wheel)", log.read_text)
        yield url, home
    finally:
        stop(process)


def test_the_installed_wheel_is_calibd_and_not_app(server_install, tmp_path):
    python = server_install / "bin" / "python"
    result = run(python, "-c", "import calibd, calibd.main; print(calibd.__file__)", cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(server_install)  # the wheel's copy, not the source tree
    imported = run(python, "-c", "import app", cwd=tmp_path, env=clean_env())
    assert imported.returncode != 0 and "No module named 'app'" in imported.stderr
    version = run(server_install / "bin" / "calibd", "--version", cwd=tmp_path, env=clean_env())
    assert version.returncode == 0 and version.stdout.strip() == f"calibd {calibd.__version__}"


def test_the_installed_wheel_serves_a_fit_and_a_calibrate(served):
    url, _ = served
    assert httpx.get(url + "/healthz").json() == {"status": "ok", "version": calibd.__version__}
    rng = np.random.default_rng(3)
    scores = rng.uniform(0.01, 0.99, 2000)
    labels = (rng.uniform(size=2000) < scores**2).astype(int)
    fitted = httpx.post(url + "/calibrators", json={"name": "wheel", "method": "isotonic", "holdout": {"scores": scores.tolist(),
                                                      "labels": labels.tolist()}}, timeout=60)
    assert fitted.status_code == 201, fitted.text
    answer = httpx.post(url + "/calibrate", json={"calibrator": "wheel", "scores": [0.1, 0.5, 0.9]})
    assert answer.status_code == 200, answer.text
    probabilities = answer.json()["probabilities"]
    # The same calibrator, fitted here by the source tree's code, gives the same numbers.
    from calibd.calibration import get_method

    local = get_method("isotonic")().fit(scores, labels)
    np.testing.assert_allclose(probabilities, local.predict(np.array([0.1, 0.5, 0.9])), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def client_install(dist, tmp_path_factory) -> Path:
    """A venv with the wheel and its base requirements only, from the local package index."""
    home = tmp_path_factory.mktemp("client-venv")
    venv = home / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=home).returncode == 0
    result = pip(venv, "--index-url", LOCAL_INDEX, str(wheel_of(dist)), cwd=home)
    assert result.returncode == 0, result.stderr[-3000:]
    return venv


def test_a_client_only_install_has_no_server_and_says_so(client_install, tmp_path):
    python = client_install / "bin" / "python"
    listed = run(python, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() for d in m.distributions()))",
                 cwd=tmp_path, env=clean_env())
    installed = set(eval(listed.stdout))  # noqa: S307 - our own print of a list of names
    assert {"calibd", "httpx", "numpy", "orjson"} <= installed
    assert not installed & {"fastapi", "uvicorn", "sqlalchemy", "scipy", "scikit-learn", "pyarrow", "pydantic"}
    serve = run(client_install / "bin" / "calibd", "serve", cwd=tmp_path, env=clean_env())
    assert serve.returncode == 2
    assert serve.stderr.count("\n") == 1 and "pip install 'calibd[server]'" in serve.stderr, serve.stderr


def readme_python_client_session() -> str:
    """The tutorial's Python client session (docs/tutorial.md), less the offline rebuild, which the
    tutorial says needs calibd[server] (the calibration code)."""
    readme = (REPO / "docs" / "tutorial.md").read_text()
    start = readme.index("\n## Python client\n")
    text = readme[start : readme.find("\n## ", start + 1)]
    blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang == "python"]
    offline = [block for block in blocks if "calibd.calibration" in block]
    assert len(offline) == 1
    assert "pip install 'calibd[server]'" in text[: text.index(offline[0])].rsplit("```", 2)[-2]  # the prose before it
    return "\n".join(block for block in blocks if block not in offline)


def test_a_client_only_install_runs_the_readme_client_session_against_the_wheel_server(client_install, served, tmp_path):
    url, _ = served
    session = readme_python_client_session()
    assert "from calibd.client import Client" in session
    result = run(client_install / "bin" / "python", "-c", session, cwd=tmp_path, env=clean_env() | {"CALIBD_URL": url},
                 timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    commands = run(client_install / "bin" / "calibd", "list", cwd=tmp_path, env=clean_env() | {"CALIBD_URL": url})
    assert commands.returncode == 0 and "churn-model" in commands.stdout, commands.stderr
