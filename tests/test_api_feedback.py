"""Feedback in both modes, monitor windows, idempotency and the drift alarm, on both databases."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from calibd.config import Settings
from calibd.metrics import brier, ece, log_loss

from .conftest import LiveServer, stored_platt_version


def fit(client, name, seed=0, **extra):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, 500)
    labels = (rng.uniform(size=500) < scores).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}} | extra
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def receipt(count=0, pending=0, unknown_ids=(), expired_ids=(), duplicate_ids=()):
    return {"count": count, "pending": pending, "unknown_ids": list(unknown_ids), "expired_ids": list(expired_ids),
            "duplicate_ids": list(duplicate_ids)}


def wait_for_samples(client, name, n, timeout=10.0):
    """The monitor once it counts ``n`` labelled predictions (labels that came early are joined behind the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        monitor = client.get(f"/calibrators/{name}/monitor").json()
        if monitor["windows"]["last_10000"]["samples"] == n or time.monotonic() > deadline:
            return monitor
        time.sleep(0.05)


def wait_logged(row_counts, name, n, timeout=10.0):
    """Wait until the prediction log (written behind the hot path) holds ``n`` predictions of ``name``."""
    query = text("SELECT count(*) FROM predictions p JOIN calibrators c ON c.id = p.calibrator_id WHERE c.name = :name")
    deadline = time.monotonic() + timeout
    while True:
        with row_counts.engine.connect() as connection:
            if connection.execute(query, {"name": name}).scalar_one() == n:
                return
        assert time.monotonic() < deadline, f"{n} predictions of {name} not logged"
        time.sleep(0.05)


def pairs(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 0.99, n)
    z = np.log(p / (1 - p)) + shift
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-z))).astype(int)
    return p, y


def test_self_contained_feedback_fills_every_window_with_the_metrics_of_its_pairs(client, name):
    fit(client, name)
    p1, y1 = pairs(700, 1)
    p2, y2 = pairs(300, 2)
    for p, y in ((p1, y1), (p2, y2)):
        response = client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()})
        assert response.status_code == 202, response.text
        assert response.json() == receipt(count=p.shape[0])
    p, y = np.r_[p1, p2], np.r_[y1, y2]
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    assert monitor["version"] == 1
    assert set(monitor["windows"]) == {"1h", "24h", "last_10000"}
    for window, values in monitor["windows"].items():
        assert values["samples"] == 1000
        assert values["ece"] == pytest.approx(ece(p, y), rel=1e-12)
        assert values["brier"] == pytest.approx(brier(p, y), rel=1e-12)
        assert values["log_loss"] == pytest.approx(log_loss(p, y), rel=1e-12)
        assert values["mean_prediction"] == pytest.approx(p.mean(), rel=1e-12)
        assert values["positive_rate"] == pytest.approx(y.mean(), rel=1e-12)
    assert monitor["drift"]["alarm"] is False and monitor["drift"]["samples"] == 1000


def test_feedback_by_logged_id_joins_labels_and_reports_unknown_ids(client, name, row_counts):
    fit(client, name)
    ids = [f"req-{i}" for i in range(50)]
    scores = np.linspace(0.02, 0.98, 50)
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids}).json()
    labels = (np.arange(50) % 3 == 0).astype(int)
    wait_logged(row_counts, name, 50)
    body = {"calibrator": name, "ids": ids[:40] + ["never-logged"], "labels": labels[:40].tolist() + [1]}
    assert client.post("/feedback", json=body).json() == receipt(count=40, pending=1, unknown_ids=["never-logged"])
    window = client.get(f"/calibrators/{name}/monitor").json()["windows"]["last_10000"]
    probabilities = np.array(served["probabilities"][:40])
    assert window["samples"] == 40
    assert window["ece"] == pytest.approx(ece(probabilities, labels[:40]), rel=1e-12)


def test_labels_sent_as_soon_as_calibrate_answers_are_all_joined(client, name):
    fit(client, name)
    rng = np.random.default_rng(11)
    ids = [f"fast-{i}" for i in range(540)]
    scores = rng.uniform(0.01, 0.99, 540)
    labels = (rng.uniform(size=540) < scores).astype(int)
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids}).json()
    answer = client.post("/feedback", json={"calibrator": name, "ids": ids, "labels": labels.tolist()}).json()
    # Whatever the log had written by then is joined now; the rest waits, and nothing is dropped.
    assert answer["count"] + answer["pending"] == 540 and answer["pending"] == len(answer["unknown_ids"])
    assert answer["duplicate_ids"] == [] and answer["expired_ids"] == []
    monitor = wait_for_samples(client, name, 540)
    window = monitor["windows"]["last_10000"]
    assert window["samples"] == 540 and monitor["drift"]["samples"] == 540
    p = np.array(served["probabilities"])
    assert window["ece"] == pytest.approx(ece(p, labels), rel=1e-12)
    assert window["brier"] == pytest.approx(brier(p, labels), rel=1e-12)
    assert monitor["windows"]["1h"]["samples"] == 540


def test_a_label_that_comes_before_the_prediction_is_served_waits_for_it(client, name):
    fit(client, name)
    ids = [f"early-{i}" for i in range(30)]
    labels = (np.arange(30) % 2).tolist()
    first = client.post("/feedback", json={"calibrator": name, "ids": ids, "labels": labels}).json()
    assert first == receipt(pending=30, unknown_ids=ids)
    # A second label for a waiting id loses to the first one.
    again = client.post("/feedback", json={"calibrator": name, "ids": ids[:5], "labels": [1 - y for y in labels[:5]]})
    assert again.json() == receipt(duplicate_ids=ids[:5])
    scores = np.linspace(0.05, 0.95, 30)
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids}).json()
    window = wait_for_samples(client, name, 30)["windows"]["last_10000"]
    assert window["samples"] == 30
    assert window["positive_rate"] == pytest.approx(np.mean(labels), rel=1e-12)
    assert window["ece"] == pytest.approx(ece(np.array(served["probabilities"]), np.array(labels)), rel=1e-12)
    # Once joined, a label for an id that already has one is a duplicate, not a pending label.
    late = client.post("/feedback", json={"calibrator": name, "ids": ids[:3], "labels": [1, 1, 1]}).json()
    assert late == receipt(duplicate_ids=ids[:3])
    listed = client.get(f"/calibrators/{name}/unmatched-labels").json()
    assert listed["pending"] == 0 and listed["unmatched"] == 0 and listed["labels"] == []


def test_a_prediction_is_labelled_once_and_duplicates_change_no_monitor(client, name, row_counts):
    fit(client, name)
    ids = [f"dup-{i}" for i in range(200)]
    rng = np.random.default_rng(5)
    scores = rng.uniform(0.01, 0.99, 200)
    labels = (rng.uniform(size=200) < scores).astype(int)
    client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids})
    wait_logged(row_counts, name, 200)
    body = {"calibrator": name, "ids": ids + ids[:3], "labels": labels.tolist() + [0, 0, 0]}
    assert client.post("/feedback", json=body).json() == receipt(count=200, duplicate_ids=ids[:3])
    before = client.get(f"/calibrators/{name}/monitor").json()
    flipped = {"calibrator": name, "ids": ids, "labels": (1 - labels).tolist()}
    assert client.post("/feedback", json=flipped).json() == receipt(duplicate_ids=ids)
    after = client.get(f"/calibrators/{name}/monitor").json()
    assert after["windows"] == before["windows"] and after["windows"]["last_10000"]["samples"] == 200
    assert {k: v for k, v in after["drift"].items() if k != "threshold"} == {k: v for k, v in before["drift"].items() if k != "threshold"}
    assert f'calibd_feedback_duplicates_total{{calibrator="{name}"}} 203.0' in client.get("/metrics").text


def test_self_contained_feedback_with_ids_counts_each_id_once(client, name):
    fit(client, name)
    p, y = pairs(100, 8)
    ids = [f"row-{i}" for i in range(100)]
    body = {"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist(), "ids": ids}
    assert client.post("/feedback", json=body).json() == receipt(count=100)
    again = body | {"probabilities": p[:10].tolist() + p[:2].tolist(), "labels": y[:10].tolist() + y[:2].tolist(),
                    "ids": [f"row-{i}" for i in range(95, 105)] + ["row-101", "row-102"]}
    assert client.post("/feedback", json=again).json() == receipt(
        count=5, duplicate_ids=[f"row-{i}" for i in range(95, 100)] + ["row-101", "row-102"]
    )
    assert client.get(f"/calibrators/{name}/monitor").json()["windows"]["24h"]["samples"] == 105


def test_an_idempotent_retry_is_counted_once(client, name):
    fit(client, name)
    p, y = pairs(200, 3)
    body = {"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()}
    headers = {"Idempotency-Key": "batch-0001"}
    first = client.post("/feedback", json=body, headers=headers)
    retry = client.post("/feedback", json=body, headers=headers)
    assert first.status_code == retry.status_code == 202
    assert retry.json() == first.json() and retry.headers["Idempotent-Replayed"] == "true"
    assert client.get(f"/calibrators/{name}/monitor").json()["windows"]["24h"]["samples"] == 200
    # The same key with another body is refused, and nothing is written.
    other_body = {"calibrator": name, "probabilities": p[:3].tolist(), "labels": y[:3].tolist()}
    reused = client.post("/feedback", json=other_body, headers=headers)
    assert reused.status_code == 422, reused.text
    assert reused.json()["errors"][0]["pointer"] == "/header/Idempotency-Key" and "Idempotency-Key" in reused.json()["detail"]
    assert client.get(f"/calibrators/{name}/monitor").json()["windows"]["24h"]["samples"] == 200
    # The same key with another calibrator is another request.
    other = f"{name}-b"
    fit(client, other)
    assert client.post("/feedback", json=body | {"calibrator": other}, headers=headers).json()["count"] == 200


def test_expired_predictions_are_reported(database_url, name):
    with LiveServer(Settings(database_url=database_url, prediction_ttl=timedelta(seconds=1))) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            fit(http, name)
            http.post("/calibrate", json={"calibrator": name, "scores": [0.3], "ids": ["old"]})
            time.sleep(1.5)
            answer = http.post("/feedback", json={"calibrator": name, "ids": ["old"], "labels": [1]}).json()
    assert answer == receipt(expired_ids=["old"])


def test_drift_raises_a_latched_alarm_per_version_and_prometheus_reports_it(client, name):
    fit(client, name)
    threshold = None
    for batch in range(12):
        p, y = pairs(2000, 100 + batch, shift=1.0)
        client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()})
        drift = client.get(f"/calibrators/{name}/monitor").json()["drift"]
        threshold = drift["threshold"]
        if drift["alarm"]:
            break
    assert drift["alarm"] is True and drift["log_evalue"] >= threshold
    # Latched: calibrated feedback afterwards does not clear it.
    p, y = pairs(2000, 999)
    client.post("/feedback", json={"calibrator": name, "probabilities": p.tolist(), "labels": y.tolist()})
    assert client.get(f"/calibrators/{name}/monitor").json()["drift"]["alarm"] is True

    alarm_line = f'calibd_monitor_drift_alarm{{calibrator="{name}",version="1"}} 1.0'
    deadline = time.monotonic() + 10  # the gauges are reread from the database at most every 2 s
    while alarm_line not in (exposition := client.get("/metrics").text):
        assert time.monotonic() < deadline, exposition
        time.sleep(0.2)
    assert f'calibd_monitor_ece{{calibrator="{name}",version="1",window="1h"}}' in exposition
    assert f'calibd_feedback_total{{calibrator="{name}"}}' in exposition

    # A new current version starts a fresh test.
    fit(client, name, seed=5)
    fresh = client.get(f"/calibrators/{name}/monitor").json()
    assert fresh["version"] == 2 and fresh["drift"]["alarm"] is False and fresh["windows"]["1h"]["samples"] == 0
    assert client.get(f"/calibrators/{name}/monitor", params={"version": 1}).json()["drift"]["alarm"] is True


BAD_FEEDBACK = [
    ("neither mode", {"labels": [1]}, "/ids"),
    ("ids and probabilities differ", {"labels": [1, 0], "ids": ["a"], "probabilities": [0.5, 0.2]}, "/ids"),
    ("label 2", {"labels": [0, 2], "probabilities": [0.1, 0.2]}, "/labels/1"),
    ("length mismatch", {"labels": [0, 1, 1], "probabilities": [0.1, 0.2]}, "/labels"),
    ("probability above 1", {"labels": [0, 1], "probabilities": [0.1, 1.2]}, "/probabilities/1"),
    ("nan", {"labels": [0, 1], "probabilities": [0.1, float("nan")]}, "/probabilities/1"),
    ("id not a string", {"labels": [0, 1], "ids": ["a", 7]}, "/ids/1"),
    ("ids and labels differ", {"labels": [0], "ids": ["a", "b"]}, "/labels"),
    ("version with ids", {"labels": [0], "ids": ["a"], "version": 1}, "/version"),
    ("unknown field", {"labels": [0], "ids": ["a"], "colour": 1}, "/colour"),
]


@pytest.mark.parametrize("case,body,at", BAD_FEEDBACK, ids=[c[0] for c in BAD_FEEDBACK])
def test_bad_feedback_is_rejected_and_writes_nothing(client, name, row_counts, case, body, at):
    fit(client, name)
    before = row_counts()
    response = client.post(
        "/feedback", content=json.dumps({"calibrator": name} | body), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert at in [e["pointer"] for e in response.json()["errors"]]
    assert row_counts() == before


def test_feedback_for_an_unknown_calibrator_is_404(client):
    response = client.post("/feedback", json={"calibrator": "no-such", "probabilities": [0.5], "labels": [1]})
    assert response.status_code == 404


def test_a_key_reused_with_another_body_writes_nothing(client, name, row_counts):
    fit(client, name)
    headers = {"Idempotency-Key": "labels-7"}
    first = {"calibrator": name, "ids": ["k-1"], "labels": [1]}
    assert client.post("/feedback", json=first, headers=headers).json() == receipt(pending=1, unknown_ids=["k-1"])
    before = row_counts()
    response = client.post("/feedback", json=first | {"ids": ["k-1", "k-2", "k-3"], "labels": [1, 0, 1]}, headers=headers)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert [e["pointer"] for e in response.json()["errors"]] == ["/header/Idempotency-Key"]
    assert row_counts() == before
    # The same request in other spacing and key order is the same request.
    spaced = json.dumps({"labels": [1], "ids": ["k-1"], "calibrator": name}, indent=2)
    replay = client.post("/feedback", content=spaced, headers=headers | {"content-type": "application/json"})
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == receipt(pending=1, unknown_ids=["k-1"])


def test_a_keyed_request_with_numbers_beyond_64_bits_is_refused_not_failed(client, name, row_counts):
    fit(client, name)
    before = row_counts()
    body = '{"calibrator": "%s", "ids": ["big"], "labels": [%d]}' % (name, 10**30)
    response = client.post("/feedback", content=body, headers={"Idempotency-Key": "big-1", "content-type": "application/json"})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/labels/0", response.text
    assert row_counts() == before


def test_labels_left_unmatched_after_the_grace_period_are_counted_and_listed(database_url, name):
    settings = Settings(database_url=database_url, pending_label_grace_seconds=0.5, pending_label_sweep_seconds=0.1)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        fit(http, name)
        answer = http.post("/feedback", json={"calibrator": name, "ids": ["lost-1", "lost-2"], "labels": [1, 0]}).json()
        assert answer == receipt(pending=2, unknown_ids=["lost-1", "lost-2"])
        deadline = time.monotonic() + 10
        while (listed := http.get(f"/calibrators/{name}/unmatched-labels").json())["unmatched"] < 2:
            assert time.monotonic() < deadline, listed
            time.sleep(0.1)
        assert listed["pending"] == 0 and listed["grace_seconds"] == 0.5
        assert sorted((label["id"], label["label"]) for label in listed["labels"]) == [("lost-1", 1), ("lost-2", 0)]
        assert f'calibd_feedback_unmatched_total{{calibrator="{name}"}} 2.0' in http.get("/metrics").text
        # An unmatched label is no longer joined: its prediction, served now, stays unlabelled.
        http.post("/calibrate", json={"calibrator": name, "scores": [0.4], "ids": ["lost-1"]})
        time.sleep(0.6)
        assert http.get(f"/calibrators/{name}/monitor").json()["windows"]["last_10000"]["samples"] == 0
        assert http.get("/calibrators/no-such/unmatched-labels").status_code == 404


def test_the_same_ids_labelled_at_once_in_opposite_orders_count_once(server, client, name, row_counts):
    from concurrent.futures import ThreadPoolExecutor

    fit(client, name)
    rounds, size = 4, 300
    ids = [f"both-{i}" for i in range(rounds * size)]
    client.post("/calibrate", json={"calibrator": name, "scores": np.linspace(0.01, 0.99, len(ids)).tolist(), "ids": ids})
    wait_logged(row_counts, name, len(ids))

    def send(order: list[str]) -> dict:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            response = http.post("/feedback", json={"calibrator": name, "ids": order, "labels": [1] * len(order)})
            assert response.status_code == 202, response.text
            return response.json()

    with ThreadPoolExecutor(2) as pool:
        for r in range(rounds):
            batch = ids[r * size : (r + 1) * size]
            answers = list(pool.map(send, [batch, batch[::-1]]))
            assert sum(a["count"] for a in answers) == size
            assert sorted(answers[0]["duplicate_ids"] + answers[1]["duplicate_ids"]) == sorted(batch)
    assert client.get(f"/calibrators/{name}/monitor").json()["windows"]["1h"]["samples"] == len(ids)


def test_concurrent_transactions_labelling_the_same_ids_in_opposite_orders_neither_fail_nor_double(database_url):
    """Storage level, many rounds: two requests inserting overlapping ids in opposite orders (which
    deadlocked on PostgreSQL's unique index) both commit, and each id is recorded once."""
    from concurrent.futures import ThreadPoolExecutor

    from calibd.services import feedback as service
    from calibd.storage import feedback as store
    from calibd.storage.db import make_engine, make_sessionmaker

    from calibd.storage import monitor_state
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, f"orders-{np.random.default_rng().integers(1 << 40):x}")
    n = 2000
    p = np.linspace(0.1, 0.9, n)

    def record(order: list[str]) -> dict:
        batch = store.LabelledBatch(info.version, p, np.ones(n, dtype=int), prediction_ids=order)
        return service.record_feedback(sessions, calibrator_id=info.calibrator_id, batches=[batch],
                                       prediction_ttl=timedelta(days=1), drift=service.DriftSettings(0.05, 0.1))

    try:
        with ThreadPoolExecutor(2) as pool:
            for r in range(12):
                ids = [f"r{r}-{i}" for i in range(n)]
                answers = list(pool.map(record, [ids, ids[::-1]]))
                assert sum(a["count"] for a in answers) == n
                assert sorted(answers[0]["duplicate_ids"] + answers[1]["duplicate_ids"]) == sorted(ids)
        sums = monitor_state.read_version(sessions, info.calibrator_id, info.version).sums
        assert sums["last_10000"].count.sum() == 10_000 and sums["24h"].count.sum() == 12 * n
    finally:
        engine.dispose()
