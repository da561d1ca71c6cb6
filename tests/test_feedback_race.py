"""Labels sent the moment a prediction is answered, to another process: every one joined, once.

Real ``calibd serve`` processes on one database. Process A serves 10,000
predictions with ids in batches of 100; as soon as A answers a batch, its
labels go to process B (on SQLite, A itself). Labels that reach the database
before their prediction wait as pending labels; after at most the grace
period all are joined, and the monitor counts exactly 10,000. Sending the
same labels again changes no monitor sum, window or drift statistic, and the
answers list the duplicates. A ``kill -9`` of B while labels are pending
loses none that B acknowledged.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from calibd.metrics import brier, ece

from .conftest import migrated_database
from .reliability.harness import CalibdProcess, fit_body, metric_values, rows, wait_until
from .reliability.scenarios import _server_faults

GRACE_SECONDS = 30  # small for the test; the default is 600
N, BATCH = 10_000, 100

#: Pending labels are swept every 0.5 s here (default 1 s): the test waits less. The one fit
#: runs in the serving process (no fit worker process to start).
SETTINGS = {"pending_label_grace_seconds": GRACE_SECONDS, "pending_label_sweep_seconds": 0.5, "fit_workers": 0}


def _feedback_rows(url: str, name: str) -> list[tuple]:
    return rows(
        url,
        "SELECT f.prediction_id, f.label FROM feedback f JOIN calibrators c ON c.id = f.calibrator_id WHERE c.name = :name",
        name=name,
    )


def _pending(url: str) -> int:
    return len(rows(url, "SELECT id FROM pending_labels"))


def _processes(url: str, folder, kind: str) -> tuple[CalibdProcess, CalibdProcess]:
    """A and B, started together; on SQLite one process plays both."""
    if kind == "sqlite":
        a = CalibdProcess(url, folder, name="a", **SETTINGS).start()
        return a, a
    a, b = (CalibdProcess(url, folder, name=n, **SETTINGS) for n in ("a", "b"))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda process: process.start(), (a, b)))
    return a, b


def _monitor(http: httpx.Client, name: str) -> dict:
    response = http.get(f"/calibrators/{name}/monitor")
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_labels_sent_to_another_process_as_soon_as_answered_are_each_joined_once(kind, tmp_path):
    name = "race"
    rng = np.random.default_rng(17)
    scores = rng.uniform(0.01, 0.99, N)
    labels = (rng.uniform(size=N) < scores**1.2).astype(int)
    ids = [f"race-{i}" for i in range(N)]
    with migrated_database(kind, tmp_path) as url:
        a, b = _processes(url, tmp_path, kind)
        try:
            with httpx.Client(base_url=a.url, timeout=60) as to_a, httpx.Client(base_url=b.url, timeout=60) as to_b:
                assert to_a.post("/calibrators", json=fit_body(name, seed=3)).status_code == 201
                probabilities = np.empty(N)
                receipts: list[dict] = []
                lock = threading.Lock()

                def send_labels(start: int) -> None:
                    batch = slice(start, start + BATCH)
                    response = to_b.post("/feedback", json={"calibrator": name, "ids": ids[batch], "labels": labels[batch].tolist()})
                    assert response.status_code == 202, response.text
                    with lock:
                        receipts.append(response.json())

                started = time.monotonic()
                with ThreadPoolExecutor(4) as pool:
                    futures = []
                    for start in range(0, N, BATCH):
                        batch = slice(start, start + BATCH)
                        served = to_a.post("/calibrate", json={"calibrator": name, "scores": scores[batch].tolist(), "ids": ids[batch]})
                        assert served.status_code == 200, served.text
                        probabilities[batch] = served.json()["probabilities"]
                        futures.append(pool.submit(send_labels, start))  # the labels leave as soon as A answers
                    for future in futures:
                        future.result()

                # Every label acknowledged: joined at once, or waiting for its prediction; none refused.
                assert sum(r["count"] for r in receipts) + sum(r["pending"] for r in receipts) == N
                assert all(r["pending"] == len(r["unknown_ids"]) and not r["duplicate_ids"] and not r["expired_ids"] for r in receipts)
                pending_at_send = sum(r["pending"] for r in receipts)

                # After at most the grace period, every label is joined, once.
                wait_until(lambda: _monitor(to_b, name)["windows"]["1h"]["samples"] == N, GRACE_SECONDS, 0.1,
                           "every label to be joined")
                joined_after = time.monotonic() - started
                stored = _feedback_rows(url, name)
                assert len(stored) == N and dict(stored) == dict(zip(ids, labels.tolist()))
                assert _pending(url) == 0
                monitor = _monitor(to_b, name)
                assert _monitor(to_a, name) == monitor
                for window in monitor["windows"].values():
                    assert window["samples"] == N
                    assert window["ece"] == pytest.approx(ece(probabilities, labels), rel=1e-9)
                    assert window["brier"] == pytest.approx(brier(probabilities, labels), rel=1e-9)
                assert monitor["drift"]["samples"] == N
                listed = to_a.get(f"/calibrators/{name}/unmatched-labels").json()
                assert (listed["pending"], listed["unmatched"]) == (0, 0)

                # The same labels again (to both processes): duplicates, and no monitor number moves.
                for start in range(0, N, BATCH):
                    batch = slice(start, start + BATCH)
                    http = (to_a, to_b)[(start // BATCH) % 2]
                    answer = http.post("/feedback", json={"calibrator": name, "ids": ids[batch], "labels": (1 - labels[batch]).tolist()})
                    assert answer.status_code == 202, answer.text
                    assert answer.json() == {"count": 0, "pending": 0, "unknown_ids": [], "expired_ids": [], "duplicate_ids": ids[batch]}
                time.sleep(1.0)  # a sweep or two pass
                assert _monitor(to_a, name) == monitor and _monitor(to_b, name) == monitor
                assert len(_feedback_rows(url, name)) == N and _pending(url) == 0
                duplicates = sum(
                    sum(metric_values(http.get("/metrics").text, "calibd_feedback_duplicates_total", calibrator=name).values())
                    for http in ((to_a, to_b) if b is not a else (to_a,))
                )
                assert duplicates == N
        finally:
            a.stop()
            if b is not a:
                b.stop()
        assert _server_faults(a) == [] and (b is a or _server_faults(b) == [])
    print(f"{kind}: {pending_at_send} of {N} labels pending when answered; all joined {joined_after:.1f} s after the first batch")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_a_process_killed_while_labels_are_pending_loses_none_it_acknowledged(kind, tmp_path):
    """Labels reach B before A has served their predictions; B is killed (SIGKILL) mid-stream and started again."""
    name = "killed"
    n, batch_size = 3000, 100
    rng = np.random.default_rng(23)
    scores = rng.uniform(0.01, 0.99, n)
    labels = rng.integers(0, 2, n)
    ids = [f"k-{i}" for i in range(n)]
    with migrated_database(kind, tmp_path) as url:
        a, b = _processes(url, tmp_path, kind)
        try:
            with httpx.Client(base_url=a.url, timeout=60) as to_a:
                assert to_a.post("/calibrators", json=fit_body(name, seed=4)).status_code == 201
            acknowledged: dict[str, int] = {}
            killed = threading.Event()

            def send_labels() -> None:
                with httpx.Client(base_url=b.url, timeout=10) as to_b:
                    for start in range(0, n, batch_size):
                        batch = slice(start, start + batch_size)
                        try:
                            response = to_b.post("/feedback", json={"calibrator": name, "ids": ids[batch], "labels": labels[batch].tolist()})
                        except httpx.TransportError:
                            assert killed.is_set()
                            continue
                        assert response.status_code == 202, response.text
                        receipt = response.json()
                        assert receipt["pending"] == batch_size and receipt["unknown_ids"] == ids[batch]
                        acknowledged.update(zip(ids[batch], labels[batch].tolist()))

            sender = threading.Thread(target=send_labels)
            sender.start()
            wait_until(lambda: len(acknowledged) >= n // 2, 60, 0.005, "half the labels acknowledged")
            killed.set()
            b.kill()
            sender.join(timeout=120)
            assert not sender.is_alive()
            assert _pending(url) >= len(acknowledged)  # all waiting, none joined yet: no prediction was served
            b.start()

            # Now the predictions, for every id whose label was sent (acknowledged or not).
            with httpx.Client(base_url=a.url, timeout=60) as to_a:
                for start in range(0, n, batch_size):
                    batch = slice(start, start + batch_size)
                    served = to_a.post("/calibrate", json={"calibrator": name, "scores": scores[batch].tolist(), "ids": ids[batch]})
                    assert served.status_code == 200, served.text
                # Labels B committed after its answer was lost may be joined too; acknowledged ones must be.
                wait_until(lambda: _pending(url) == 0, GRACE_SECONDS, 0.1, "every pending label to be joined")
                stored = dict(_feedback_rows(url, name))
                assert len(stored) == len(_feedback_rows(url, name))  # one row per id
                assert {i: stored.get(i) for i in acknowledged} == acknowledged
                assert set(stored) <= set(ids)
                samples = _monitor(to_a, name)["windows"]["1h"]["samples"]
                assert samples == len(stored)
        finally:
            b.stop()
            if a is not b:
                a.stop()
        assert _server_faults(a) == []
    print(f"{kind}: {len(acknowledged)} labels acknowledged before the kill, {len(stored)} joined after the restart")
