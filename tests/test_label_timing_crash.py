"""kill -9 while labels wait for maturity, then a restart: nothing acknowledged is lost or counted twice."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest

from .conftest import migrated_database
from .processes import children, running
from .reliability.harness import CalibdProcess, fit_body, rows, wait_until

SETTINGS = {"label_maturity_seconds": 0.3, "pending_label_sweep_seconds": 0.3, "fit_workers": 0}
WINDOW = 8  # seconds: labels wait this long after their prediction


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_process_killed_while_labels_wait_for_maturity_loses_and_doubles_none(kind, tmp_path):
    name = "waiting"
    n, batch_size = 1500, 100
    rng = np.random.default_rng(5)
    scores = rng.uniform(0.01, 0.99, n)
    labels = rng.integers(0, 2, n)
    ids = [f"w-{i}" for i in range(n)]
    with migrated_database(kind, tmp_path) as url:
        process = CalibdProcess(url, tmp_path, name="a", **SETTINGS).start()
        try:
            with httpx.Client(base_url=process.url, timeout=60) as http:
                body = fit_body(name, seed=4) | {"labels": {"window": f"{WINDOW}s", "missing": "negative"}}
                assert http.post("/calibrators", json=body).status_code == 201
                for start in range(0, n, batch_size):
                    batch = slice(start, start + batch_size)
                    served = http.post("/calibrate", json={"calibrator": name, "scores": scores[batch].tolist(), "ids": ids[batch]})
                    assert served.status_code == 200
                wait_until(lambda: rows(url, "SELECT count(*) FROM predictions")[0][0] == n, 30, 0.1, "the prediction log")
            acknowledged: dict[str, int] = {}
            killed = threading.Event()

            def send_labels() -> None:
                with httpx.Client(base_url=process.url, timeout=10) as http:
                    for start in range(0, n, batch_size):
                        batch = slice(start, start + batch_size)
                        try:
                            answer = http.post("/feedback", json={"calibrator": name, "ids": ids[batch], "labels": labels[batch].tolist()})
                        except httpx.TransportError:
                            assert killed.is_set()
                            continue
                        assert answer.status_code == 202, answer.text
                        assert answer.json()["late_ids"] == []
                        acknowledged.update(zip(ids[batch], labels[batch].tolist()))

            # The maturity process starts at a maturity tick, which may come a moment after the first
            # labels would (on SQLite its read takes the write lock the prediction log's writes hold).
            wait_until(lambda: children(process.pid), 30, 0.05, "the maturity process to start")
            sender = threading.Thread(target=send_labels)
            sender.start()
            wait_until(lambda: len(acknowledged) >= n // 3, 60, 0.005, "a third of the labels acknowledged")
            killed.set()
            helpers = children(process.pid)  # the maturity process (the calibrator has a window) and its kin
            assert helpers
            process.kill()
            sender.join(timeout=60)
            assert not sender.is_alive()
            # The maturity process ends with the killed one (within its watch's second): none lingers holding a batch.
            wait_until(lambda: not any(running(pid) for pid in helpers), 30, 0.1, "the killed process's helpers to end")
            waiting = rows(url, "SELECT count(*) FROM feedback WHERE waiting")[0][0]
            assert waiting >= len(acknowledged)  # stored, none matured yet: the window has not passed
            process.start()
            with httpx.Client(base_url=process.url, timeout=60) as http:
                def matured() -> dict | None:
                    monitor = http.get(f"/calibrators/{name}/monitor").json()
                    return monitor if monitor["drift"]["samples"] == n else None

                monitor = wait_until(matured, 60, 0.2, "every prediction to mature")
        finally:
            process.stop()
        stored = dict(rows(url, "SELECT prediction_id, label FROM feedback WHERE NOT waiting"))
        assert len(stored) == n == len(rows(url, "SELECT id FROM feedback"))  # one row per prediction
        assert {i: stored[i] for i in acknowledged} == acknowledged  # every acknowledged label, as sent
        # The ids never labelled became implied negatives; at most one batch committed without its answer.
        implied = monitor["labels"]["implied_negatives"]
        assert n - len(acknowledged) - batch_size <= implied <= n - len(acknowledged)
        assert sum(1 for i in ids if i not in acknowledged and stored[i] == 0) >= implied
        assert monitor["windows"]["last_10000"]["samples"] == n
        assert monitor["labels"]["late_labels"] == 0 and monitor["labels"]["waiting_labels"] == 0
