"""A real MLServer (mlserver + mlserver-sklearn from PyPI) serving a scikit-learn classifier on loopback,
over REST and gRPC.

MLServer lives in a virtualenv of its own, built on first use under .venv-mlserver/ at the root of
the checkout (kept between runs, rebuilt when the pinned versions change): its dependencies
(FastAPI, pydantic, ...) are pinned differently from calibd's. The classifier is trained inside
that virtualenv, with its scikit-learn, so the stored model loads there as it was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.processes import free_port, stop, wait_ready

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-mlserver"
REQUIREMENTS = ["mlserver==1.7.1", "mlserver-sklearn==1.7.1"]
STAMP = VENV / ".installed"

TRAIN = """
import sys
import joblib
import numpy as np
from sklearn.ensemble import RandomForestClassifier

rng = np.random.default_rng(0)
X = rng.normal(size=(3000, 4))
y = (X[:, 0] + 0.5 * X[:, 1] - X[:, 2] * X[:, 3] + rng.normal(scale=0.8, size=3000) > 0).astype(int)
model = RandomForestClassifier(n_estimators=25, min_samples_leaf=5, random_state=0).fit(X, y)
joblib.dump(model, sys.argv[1])
"""


def python() -> Path:
    """The virtualenv's interpreter, after building it if needed."""
    interpreter = VENV / "bin" / "python"
    wanted = "\n".join(REQUIREMENTS)
    if STAMP.exists() and STAMP.read_text() == wanted and interpreter.exists():
        return interpreter
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    STAMP.write_text(wanted)
    return interpreter


class MLServer:
    """``mlserver start`` on a folder holding one sklearn model named ``model_name``.

    ``train`` is the script (run by the virtualenv's interpreter with the model's path, then
    ``train_args``) that writes the model's joblib; by default a small random forest.
    """

    def __init__(self, folder: Path, model_name: str, train: str = TRAIN, train_args: tuple[str, ...] = ()):
        self.folder = folder
        self.model_name = model_name
        self.train, self.train_args = train, train_args
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> MLServer:
        interpreter = python()
        model_dir = self.folder / self.model_name
        model_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(interpreter), "-c", self.train, str(model_dir / "model.joblib"), *self.train_args], check=True)
        (model_dir / "model-settings.json").write_text(json.dumps({
            "name": self.model_name,
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": "./model.joblib", "version": "v1"},
        }))
        (self.folder / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1",
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_port": free_port(),
            "parallel_workers": 0,  # inference in the server process itself
            "debug": False,
        }))
        log = open(self.folder / "mlserver.log", "w")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CALIBD_", "PYTHON", "VIRTUAL_ENV"))}
        self.process = subprocess.Popen(
            [str(VENV / "bin" / "mlserver"), "start", str(self.folder)],
            cwd=self.folder, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_ready(self.process, f"{self.url}/v2/models/{self.model_name}/ready", 120, "MLServer",
                   lambda: (self.folder / "mlserver.log").read_text(errors="replace"))
        return self

    def __exit__(self, *exc) -> None:
        stop(self.process)
