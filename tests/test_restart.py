"""A new process on the same database serves exactly what the old one did."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import numpy as np

from .conftest import REPO, free_port


def start(database_url: str, port: int) -> subprocess.Popen:
    env = os.environ | {"CALIBD_DATABASE_URL": database_url}
    process = subprocess.Popen(
        [sys.executable, "-m", "calibd.cli", "serve", "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert process.poll() is None, process.stderr.read().decode()
        time.sleep(0.1)
    process.kill()
    raise AssertionError("calibd did not become ready")


def test_restart_serves_identical_probabilities(database_url, name):
    rng = np.random.default_rng(11)
    scores = rng.uniform(0, 1, 500)
    labels = (rng.uniform(size=500) < scores**1.5).astype(int)
    query = {"calibrator": name, "scores": np.linspace(0, 1, 101).tolist()}
    port = free_port()

    process = start(database_url, port)
    try:
        url = f"http://127.0.0.1:{port}"
        body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
        assert httpx.post(f"{url}/calibrators", json=body, timeout=60).status_code == 201
        first = httpx.post(f"{url}/calibrate", json=query).json()
    finally:
        process.terminate()
        # uvicorn shuts down gracefully, then re-raises SIGTERM to report it.
        assert process.wait(timeout=30) in (0, -15)

    process = start(database_url, port)
    try:
        second = httpx.post(f"http://127.0.0.1:{port}/calibrate", json=query).json()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert second == first
