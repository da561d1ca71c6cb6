"""Concurrent fits get distinct consecutive versions; promotions reach every process."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from calibd.config import Settings

from .conftest import LiveServer


def fit_body(name: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, 300)
    labels = (rng.uniform(size=300) < scores).astype(int)
    return {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}


def test_twenty_concurrent_fits_of_one_name_across_two_processes(server, database_url, name):
    with LiveServer(Settings(database_url=database_url)) as other:
        urls = [server.url, other.url]

        def post(i: int) -> int:
            with httpx.Client(base_url=urls[i % 2], timeout=120) as http:
                response = http.post("/calibrators", json=fit_body(name, i))
                assert response.status_code == 201, response.text
                return response.json()["version"]

        with ThreadPoolExecutor(max_workers=20) as pool:
            versions = list(pool.map(post, range(20)))
    assert sorted(versions) == list(range(1, 21))
    with httpx.Client(base_url=server.url, timeout=60) as http:
        detail = http.get(f"/calibrators/{name}").json()
    assert detail["latest_version"] == 20
    assert [v["version"] for v in detail["versions"]] == list(range(1, 21))


def test_a_promotion_reaches_another_process_within_a_second(server, database_url, name):
    with (
        LiveServer(Settings(database_url=database_url)) as other,
        httpx.Client(base_url=server.url, timeout=60) as a,
        httpx.Client(base_url=other.url, timeout=60) as b,
    ):
        assert a.post("/calibrators", json=fit_body(name, 1)).status_code == 201
        assert a.post("/calibrators", json=fit_body(name, 2) | {"promote": False}).status_code == 201

        def served_version(http) -> int:
            return http.post("/calibrate", json={"calibrator": name, "scores": [0.4]}).json()["version"]

        assert served_version(b) == 1  # b has loaded and cached version 1
        assert a.post(f"/calibrators/{name}/promote", json={"version": 2}).status_code == 200
        promoted = time.monotonic()
        assert served_version(a) == 2  # the promoting process: on the next request
        while served_version(b) != 2:
            assert time.monotonic() - promoted < 1.0, "the other process still serves version 1 after 1 s"
            time.sleep(0.01)

        # A rollback travels the same way.
        assert b.post(f"/calibrators/{name}/promote", json={"version": 1}).status_code == 200
        rolled_back = time.monotonic()
        assert served_version(b) == 1
        while served_version(a) != 1:
            assert time.monotonic() - rolled_back < 1.0
            time.sleep(0.01)
