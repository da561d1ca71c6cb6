"""The README's quickstart and the documentation's tutorial (docs/tutorial.md), tried as a new user would.

In a fresh folder laid out as the repository is after `make run` (its `.venv`, here a link to
the environment these tests run in), with `.venv/bin` NOT on the PATH, `.venv/bin/calibd serve`
runs as `make run` runs it; then the README's quickstart and the tutorial's curl, Python client
and command-line sections run as written, in that order. The one change made to them: the server listens on a free port, so
`localhost:8000` in the curl lines becomes that port, and CALIBD_URL (which the README
documents) points the client and the CLI at it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .conftest import REPO, free_port

README = (REPO / "README.md").read_text()
TUTORIAL = (REPO / "docs" / "tutorial.md").read_text()


def section(title: str, text: str = TUTORIAL) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S) if lang == language]


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory):
    """A folder with .venv, a PATH without it, and `.venv/bin/calibd serve` running there."""
    if sys.prefix == sys.base_prefix:
        pytest.fail("the tests run in a virtualenv (make test makes .venv)")
    home = tmp_path_factory.mktemp("clone")
    (home / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != Path(venv_bin))
    env = {key: value for key, value in os.environ.items() if not key.startswith("CALIBD_") and key != "VIRTUAL_ENV"}
    env["PATH"] = path
    assert shutil.which("calibd", path=path) is None or Path(shutil.which("calibd", path=path)).parent != Path(venv_bin)
    port = free_port()
    server = subprocess.Popen([".venv/bin/calibd", "serve", "--port", str(port)], cwd=home, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "`.venv/bin/calibd serve` did not start"
            time.sleep(0.2)
        yield home, env | {"CALIBD_URL": url}, port
    finally:
        server.terminate()
        server.wait(timeout=30)


def bash(script: str, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=home, env=env, capture_output=True, text=True, timeout=600)


def test_the_readme_quickstart_runs_as_written(first_hour):
    home, env, port = first_hour
    scripts = blocks(section("Quickstart", README), "sh")
    assert len(scripts) == 1
    result = bash("set -euo pipefail\n" + scripts[0].replace("localhost:8000", f"localhost:{port}"), home, env)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "urn:calibd:problem" not in output, output
    assert '"probabilities"' in output, output
    monitor = httpx.get(f"http://127.0.0.1:{port}/calibrators/quickstart/monitor").json()
    assert monitor["version"] == 1 and monitor["windows"]["last_10000"]["samples"] == 2, monitor


def test_the_curl_section_runs_as_written(first_hour):
    home, env, port = first_hour
    scripts = blocks(section("A first calibrator, with curl"), "sh")
    assert len(scripts) >= 4 and any("arrow.stream" in s for s in scripts)
    for script in scripts:
        result = bash("set -euo pipefail\n" + script.replace("localhost:8000", f"localhost:{port}"), home, env)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "command not found" not in output, (script, output)
        assert "urn:calibd:problem" not in output, (script, output)  # no request was refused
    fitted = httpx.get(f"http://127.0.0.1:{port}/calibrators/fraud-model").json()
    assert fitted["latest_version"] == 4  # the JSON, CSV, Parquet and Arrow fits


def test_the_python_client_section_runs_as_written(first_hour):
    home, env, _ = first_hour
    text = section("Python client")
    install = blocks(text, "sh")
    assert install and all("pip install" in block for block in install)  # into one's own environment
    assert "./calibd" not in "".join(install)  # no folder name assumed
    session = "\n".join(blocks(text, "python"))
    result = subprocess.run([".venv/bin/python", "-c", session], cwd=home, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert (home / "churn-model.html").read_text().startswith("<!doctype html>")


def test_the_command_line_section_runs_as_written(first_hour):
    home, env, _ = first_hour
    text = section("Command line")
    setup = blocks(text, "sh")
    assert len(setup) == 1 and "source .venv/bin/activate" in setup[0]
    result = bash("set -euo pipefail\n" + setup[0], home, env)
    assert result.returncode == 0 and "command not found" not in result.stderr, result.stderr
    console = blocks(text, "console")
    assert len(console) == 1
    lines = console[0].splitlines()
    commands = [(i, line[2:]) for i, line in enumerate(lines) if line.startswith("$ ")]
    assert len(commands) >= 10
    for index, command in commands:
        # Each command as typed in the shell that ran the block above (its venv activated).
        result = bash(f"source .venv/bin/activate\n{command}", home, env)
        output = result.stdout + result.stderr
        assert "command not found" not in output, (command, output)
        shown = re.search(r"exit status (\d+)", "\n".join(lines[index + 1 : index + 4]))
        if "exit status" in command:
            assert shown and f"exit status {shown.group(1)}" in result.stdout, (command, output)
        else:
            assert result.returncode == 0, (command, output)
