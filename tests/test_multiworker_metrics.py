"""With several uvicorn workers, /metrics adds up every worker's counters.

Each worker counts its requests in plain numbers and adds them to its
metrics file every CALIBD_METRICS_FLUSH_SECONDS (api/pending_metrics.py);
the scraped worker adds its own before answering. So the totals are exact
once every worker has flushed: at most one interval after the last request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from .conftest import REPO, free_port


FLUSH_SECONDS = 0.2


def _sample(exposition: str, series: str) -> float:
    """The value of one series of a Prometheus exposition (exactly as named, labels sorted as written)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.rsplit(" ", 1)[0] == series]
    assert len(values) == 1, f"{series}: {values}"
    return values[0]


def test_counters_add_up_across_two_workers(tmp_path):
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = os.environ | {
        "CALIBD_DATABASE_URL": f"sqlite:///{tmp_path / 'workers.db'}",
        "CALIBD_JSON_LOGS": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "CALIBD_METRICS_FLUSH_SECONDS": str(FLUSH_SECONDS),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "calibd.cli", "serve", "--port", str(port), "--workers", "2"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.2)
        rng = np.random.default_rng(0)
        scores = rng.uniform(size=200)
        body = {"name": "workers", "method": "platt", "holdout": {"scores": scores.tolist(), "labels": (scores > 0.5).astype(int).tolist()}}
        assert httpx.post(f"{url}/calibrators", json=body, timeout=120).status_code == 201
        n = 200

        def call(_):
            with httpx.Client(base_url=url) as http:  # a new connection each time, so both workers get some
                return http.post("/calibrate", json={"calibrator": "workers", "scores": [0.1, 0.9]}).status_code

        with ThreadPoolExecutor(max_workers=8) as pool:
            assert set(pool.map(call, range(n))) == {200}
        # Every worker flushes within FLUSH_SECONDS of its last request: after three intervals all have.
        time.sleep(3 * FLUSH_SECONDS)
        # Each worker process keeps its own counter file; /metrics adds them up.
        assert len({path.name for path in metrics_dir.glob("counter_*.db")}) >= 2
        for _ in range(2):  # and a second scrape, an interval later, counts nothing twice
            exposition = httpx.get(f"{url}/metrics").text
            assert _sample(exposition, 'calibd_calibrate_requests_total{calibrator="workers"}') == n
            assert _sample(exposition, 'calibd_calibrate_scores_total{calibrator="workers"}') == 2 * n
            labels = 'method="POST",route="/calibrate",status="200"'
            assert _sample(exposition, f"calibd_request_duration_seconds_count{{{labels}}}") == n
            assert _sample(exposition, f'calibd_request_duration_seconds_bucket{{le="+Inf",{labels}}}') == n
            assert 0 < _sample(exposition, f"calibd_request_duration_seconds_sum{{{labels}}}") < n * 10
            time.sleep(2 * FLUSH_SECONDS)
    finally:
        server.terminate()
        server.wait(timeout=60)
