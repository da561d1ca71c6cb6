"""Closed-loop recalibration: a drifting stream gets a better version promoted; a worse candidate never is."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from calibd.config import Settings
from calibd.metrics import ece, log_loss
from calibd.monitoring.recalibration import compare_log_loss
from calibd.storage import recalibration as loop_store

from .conftest import LiveServer


def stream(n, seed, shift=0.0):
    rng = np.random.default_rng(seed)
    z = rng.normal(-1.0, 1.5, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(z + shift)))).astype(int)
    return z, y


def send(http, name, z, y):
    """Calibrate with the current version, then label what it served (with the raw scores)."""
    served = http.post("/calibrate", json={"calibrator": name, "scores": z.tolist()}).json()
    body = {"calibrator": name, "version": served["version"], "probabilities": served["probabilities"],
            "scores": z.tolist(), "labels": y.tolist()}
    assert http.post("/feedback", json=body).status_code == 202
    return served["version"]


def events(http, name):
    return client_events(http.get(f"/calibrators/{name}/recalibration").json())


def client_events(state):
    return [(e["outcome"], e["candidate_version"]) for e in reversed(state["events"])]


@pytest.fixture
def live(database_url):
    with LiveServer(Settings(database_url=database_url, recalibration_interval_seconds=0.3)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http


def test_a_drift_is_caught_refitted_shadow_tested_and_promoted(live, name):
    z, y = stream(3000, 1)
    fit = {"name": name, "method": "platt", "input": "logit", "holdout": {"scores": z.tolist(), "labels": y.tolist()}}
    assert live.post("/calibrators", json=fit).status_code == 201
    policy = {"trigger": "alarm", "refit_rows": 3000, "min_refit_rows": 1000, "shadow_rows": 2000, "margin": 0.001}
    assert live.put(f"/calibrators/{name}/recalibration", json=policy).status_code == 200

    history = []
    for batch in range(40):
        zb, yb = stream(1000, 100 + batch, shift=1.0)  # the world drifted: a logit shift of +1
        version = send(live, name, zb, yb)
        history.append(version)
        if ("promoted", 2) in events(live, name):
            break
        time.sleep(0.4)  # let the loop take a pass
    assert events(live, name)[:2] == [("refit", 2), ("promoted", 2)], live.get(f"/calibrators/{name}/recalibration").json()
    assert live.get(f"/calibrators/{name}").json()["current_version"] == 2

    # The session's other server on this database runs a loop too, and may be the one that promoted:
    # this server then learns of it at its next registry poll (about twice a second).
    deadline = time.monotonic() + 5
    while (served := live.post("/calibrate", json={"calibrator": name, "scores": [0.0]}).json()["version"]) != 2:
        assert time.monotonic() < deadline, f"still serving version {served} 5 s after the promotion"
        time.sleep(0.1)

    # The promoted version restores calibration on fresh drifted data.
    z_new, y_new = stream(20_000, 999, shift=1.0)
    old = np.array(live.post("/calibrate", json={"calibrator": name, "version": 1, "scores": z_new.tolist()}).json()["probabilities"])
    answer = live.post("/calibrate", json={"calibrator": name, "scores": z_new.tolist()}).json()
    assert answer["version"] == 2
    new = np.array(answer["probabilities"])
    assert ece(new, y_new) < 0.03 < ece(old, y_new)
    assert log_loss(new, y_new) < log_loss(old, y_new)

    state = live.get(f"/calibrators/{name}/recalibration").json()
    promoted = next(e for e in state["events"] if e["outcome"] == "promoted")
    assert promoted["details"]["improvement"] > 0.001 and promoted["details"]["interval"][0] > 0
    exposition = live.get("/metrics").text
    series = f'calibd_recalibration_total{{calibrator="{name}",outcome="promoted"}}'
    assert [line for line in exposition.splitlines() if line.startswith(series + " ")] == [series + " 1.0"]
    page = live.get(f"/calibrators/{name}/report", params={"format": "html"}).text
    assert 'id="recalibration"' in page and "promoted" in page


def test_a_worse_candidate_is_never_promoted(live, name):
    z, y = stream(5000, 2)
    fit = {"name": name, "method": "platt", "input": "logit", "holdout": {"scores": z.tolist(), "labels": y.tolist()}}
    assert live.post("/calibrators", json=fit).status_code == 201
    # No drift, and a candidate method that cannot beat Platt on a logistic world.
    policy = {"trigger": "schedule", "schedule_hours": 0.0001, "refit_rows": 1000, "min_refit_rows": 500,
              "shadow_rows": 1000, "margin": 0.001, "method": "histogram", "options": {"n_bins": 40}}
    assert live.put(f"/calibrators/{name}/recalibration", json=policy).status_code == 200
    for batch in range(25):
        send(live, name, *stream(1000, 200 + batch))
        if sum(outcome == "kept" for outcome, _ in events(live, name)) >= 2:
            break
        time.sleep(0.4)
    outcomes = events(live, name)
    assert sum(outcome == "kept" for outcome, _ in outcomes) >= 2, outcomes
    assert all(outcome != "promoted" for outcome, _ in outcomes)
    assert live.get(f"/calibrators/{name}").json()["current_version"] == 1


def test_policy_validation(client, name):
    rng = np.random.default_rng(0)
    s = rng.uniform(size=50)
    client.post("/calibrators", json={"name": name, "method": "platt", "holdout": {"scores": s.tolist(), "labels": (s > 0.5).astype(int).tolist()}})
    assert client.put(f"/calibrators/{name}/recalibration", json={"trigger": "schedule"}).status_code == 422
    assert client.put(f"/calibrators/{name}/recalibration", json={"margin": -1}).status_code == 422
    assert client.put("/calibrators/no-such/recalibration", json={}).status_code == 404
    assert client.get(f"/calibrators/{name}/recalibration").json() == {
        "policy": None, "candidate_version": None, "last_refit_at": None, "events": []
    }


def test_the_promotion_rule_by_hand():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 5000)
    good = np.where(y == 1, 0.8, 0.2)
    bad = np.full(5000, 0.5)
    assert compare_log_loss(bad, good, y).promote  # clearly better
    assert not compare_log_loss(good, bad, y).promote  # clearly worse
    same = compare_log_loss(good, good, y)
    assert not same.promote and same.improvement == 0.0  # no better than the margin
    # A tiny real improvement passes a zero margin only if its interval clears zero.
    slightly = np.where(y == 1, 0.801, 0.199)
    verdict = compare_log_loss(good, slightly, y, margin=0.0)
    assert verdict.promote == (verdict.interval[0] > 0) and verdict.improvement > 0


def test_two_apps_in_one_process_hold_separate_leases(fresh_database):
    """Each app's loop takes a calibrator's lease as itself: two apps served from one process
    (the test servers run as threads of one) must not both work on the same loop at once."""
    z, y = stream(500, 3)
    fit = {"name": "leased", "method": "platt", "input": "logit", "holdout": {"scores": z.tolist(), "labels": y.tolist()}}
    with LiveServer(Settings(database_url=fresh_database)) as first, LiveServer(Settings(database_url=fresh_database)) as second:
        with httpx.Client(base_url=first.url, timeout=60) as http:
            assert http.post("/calibrators", json=fit).status_code == 201
            assert http.put("/calibrators/leased/recalibration", json={"trigger": "alarm"}).status_code == 200
        services = [live.server.config.app.state.services for live in (first, second)]
        sessions = services[0].sessions
        ((calibrator_id, _),) = loop_store.enabled_calibrators(sessions)
        assert loop_store.claim(sessions, calibrator_id, services[0].owner) is not None
        assert loop_store.claim(sessions, calibrator_id, services[1].owner) is None
        loop_store.release(sessions, calibrator_id, services[0].owner)
        assert loop_store.claim(sessions, calibrator_id, services[1].owner) is not None
