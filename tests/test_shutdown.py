"""Stopping `calibd serve` prints no warnings: no leaked semaphores, no worker tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import free_port


@pytest.mark.parametrize("how", ["SIGTERM to the server", "Ctrl-C to its process group"])
def test_a_stop_after_a_fit_is_quiet(tmp_path, how):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("CALIBD_")}
    env |= {"CALIBD_DATABASE_URL": f"sqlite:///{tmp_path / 'calibd.db'}", "CALIBD_JSON_LOGS": "false",
            "CALIBD_LOG_LEVEL": "WARNING"}
    calibd = os.path.join(os.path.dirname(sys.executable), "calibd")
    server = subprocess.Popen([calibd, "serve", "--port", str(port)], env=env, cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "calibd serve did not start"
            time.sleep(0.2)
        holdout = {"scores": [0.1, 0.2, 0.3, 0.6, 0.7, 0.9, 0.4, 0.8, 0.5, 0.35], "labels": [0, 0, 0, 1, 1, 1, 0, 1, 1, 0]}
        fitted = httpx.post(f"http://127.0.0.1:{port}/calibrators", json={"name": "a", "method": "platt", "holdout": holdout},
                            timeout=120)
        assert fitted.status_code == 201, fitted.text  # the fit worker and its queues are up
        if how.startswith("SIGTERM"):
            server.send_signal(signal.SIGTERM)
        else:
            os.killpg(server.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        output, _ = server.communicate(timeout=60)  # until every process holding the pipe is gone
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    text = output.decode(errors="replace")
    for noise in ("leaked", "resource_tracker", "Traceback", "Warning", "Error"):
        assert noise not in text, text
