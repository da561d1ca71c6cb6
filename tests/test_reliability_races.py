"""Races that used to answer 500, on SQLite and PostgreSQL, over HTTP: feedback that brings new
segment values while the monitor, the report and /metrics are read, and writes to a calibrator
while it is deleted. Each runs a fixed number of rounds; no answer may be a 5xx.

The readers used to read window sums and drift tests in two transactions, so a segment created
in between was in one and not the other (KeyError). Writes during a delete met a foreign key or a
row that had gone (IntegrityError, StaleDataError). Both must now answer with the data of one
moment, or 404/409.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

HOLDOUT = {"scores": [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9] * 4, "labels": [0, 0, 1, 0, 1, 0, 1, 1] * 4}


def fit(client: httpx.Client, name: str) -> None:
    response = client.post("/calibrators", json={"name": name, "method": "platt", "holdout": HOLDOUT})
    assert response.status_code == 201, response.text


def test_new_segment_values_while_monitors_are_read_never_answer_5xx(server, name):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        fit(client, name)
        put = client.put(f"/calibrators/{name}/segments", json={"dimensions": ["country"], "max_values": 40})
        assert put.status_code == 200, put.text
    statuses: list[tuple[str, int]] = []
    lock = threading.Lock()
    writing = threading.Event()

    def writer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for round_ in range(12):  # each sends values never seen: new segments every round, then __OTHER
                p = rng.uniform(0.05, 0.95, 20)
                body = {
                    "calibrator": name, "probabilities": p.tolist(), "labels": (rng.uniform(size=20) < p).astype(int).tolist(),
                    "segments": {"country": [f"c{seed}-{round_}-{i % 2}" for i in range(20)]},
                }
                response = client.post("/feedback", json=body)
                with lock:
                    statuses.append(("feedback", response.status_code))
                writing.set()

    def reader(path: str) -> None:
        writing.wait(30)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(30):
                response = client.get(path)
                with lock:
                    statuses.append((path, response.status_code))

    paths = [f"/calibrators/{name}/monitor", f"/calibrators/{name}/report", "/metrics"]
    with ThreadPoolExecutor(2 + len(paths)) as pool:
        futures = [pool.submit(writer, seed) for seed in (1, 2)] + [pool.submit(reader, path) for path in paths]
        for future in futures:
            future.result()
    failures = [(what, status) for what, status in statuses if status >= 500]
    assert not failures, failures
    assert {status for what, status in statuses if what == "feedback"} == {202}
    assert len(statuses) == 2 * 12 + 3 * 30
    # The monitor holds the segments the writers brought (40 values tracked of 48, the rest in __OTHER).
    with httpx.Client(base_url=server.url, timeout=60) as client:
        monitor = client.get(f"/calibrators/{name}/monitor").json()
    segments = {s["segment"] for s in monitor["segments"]}
    assert len(segments) == 41 and "__OTHER" in segments
    assert sum(s["windows"]["last_10000"]["samples"] for s in monitor["segments"]) == 2 * 12 * 20


def _race(server, name: str, write, rounds: int) -> list[int]:
    """Fit ``name``, then run ``write(client, name)`` and DELETE at once, ``rounds`` times; the writes' statuses."""
    statuses = []
    with httpx.Client(base_url=server.url, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        for _ in range(rounds):
            fit(client, name)
            barrier = threading.Barrier(2)

            def deleting() -> int:
                barrier.wait()
                return client.delete(f"/calibrators/{name}").status_code

            def writing() -> int:
                barrier.wait()
                return write(client, name)

            deleted, written = pool.submit(deleting), pool.submit(writing)
            assert deleted.result() in (204, 404)
            statuses.append(written.result())
            client.delete(f"/calibrators/{name}")
    return statuses


def test_writes_racing_a_delete_answer_404_or_409_never_5xx(server, name):
    def feedback_by_ids(client: httpx.Client, name: str) -> int:
        ids = [f"r{i}" for i in range(50)]
        return client.post("/feedback", json={"calibrator": name, "ids": ids, "labels": [i % 2 for i in range(50)]}).status_code

    def promote(client: httpx.Client, name: str) -> int:
        return client.post(f"/calibrators/{name}/promote", json={"version": 1}).status_code

    def segments(client: httpx.Client, name: str) -> int:
        return client.put(f"/calibrators/{name}/segments", json={"dimensions": ["country"], "max_values": 5}).status_code

    for write, allowed in (
        (feedback_by_ids, {202, 404, 409}),
        (promote, {200, 404, 409}),
        (segments, {200, 404, 409}),
    ):
        statuses = _race(server, name, write, rounds=8)
        assert set(statuses) <= allowed, (write.__name__, statuses)
