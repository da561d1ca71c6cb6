"""Feedback in both modes, monitor windows, idempotency and the drift alarm, on both databases."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.metrics import brier, ece, log_loss

from .conftest import LiveServer


def fit(client, name, seed=0, **extra):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, 500)
    labels = (rng.uniform(size=500) < scores).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}} | extra
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    return response.json()


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
        assert response.json() == {"count": p.shape[0], "unknown_ids": [], "expired_ids": []}
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


def test_feedback_by_logged_id_joins_labels_and_reports_unknown_ids(client, name):
    fit(client, name)
    ids = [f"req-{i}" for i in range(50)]
    scores = np.linspace(0.02, 0.98, 50)
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "ids": ids}).json()
    labels = (np.arange(50) % 3 == 0).astype(int)
    body = {"calibrator": name, "ids": ids[:40] + ["never-logged"], "labels": labels[:40].tolist() + [1]}
    deadline = time.monotonic() + 10
    while True:  # the prediction log is written behind the hot path
        receipt = client.post("/feedback", json=body).json()
        if receipt["count"] == 40 or time.monotonic() > deadline:
            break
        assert receipt["count"] == 0
        time.sleep(0.1)
    assert receipt == {"count": 40, "unknown_ids": ["never-logged"], "expired_ids": []}
    window = client.get(f"/calibrators/{name}/monitor").json()["windows"]["last_10000"]
    probabilities = np.array(served["probabilities"][:40])
    assert window["samples"] == 40
    assert window["ece"] == pytest.approx(ece(probabilities, labels[:40]), rel=1e-12)


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
            receipt = http.post("/feedback", json={"calibrator": name, "ids": ["old"], "labels": [1]}).json()
    assert receipt == {"count": 0, "unknown_ids": [], "expired_ids": ["old"]}


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
    ("both modes", {"labels": [1], "ids": ["a"], "probabilities": [0.5]}, "/ids"),
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
    import json

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
