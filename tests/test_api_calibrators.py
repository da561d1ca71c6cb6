"""Fit, serve, inspect, promote and delete calibrators over HTTP, on both databases."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
from importlib import metadata

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from calibd.calibration import from_dict


def holdout(n: int = 400, seed: int = 0) -> dict:
    """Overconfident scores: the true probability is p**2 where the model says p."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < scores**2).astype(int)
    return {"scores": scores.tolist(), "labels": labels.tolist()}


def fit(client, name, method="platt", **extra):
    body = {"name": name, "method": method, "holdout": extra.pop("holdout", holdout())} | extra
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_fit_then_calibrate_serves_the_stored_calibrator(client, name):
    data = holdout()
    created = fit(client, name, holdout=data)
    assert created["version"] == 1 and created["current"] is True
    assert created["n_samples"] == 400 and created["n_classes"] == 2
    assert set(created["summary"]["before"]) >= {"ece", "brier", "log_loss"}
    assert set(created["summary"]["after"]) >= {"ece", "brier", "log_loss"}
    assert len(created["holdout_sha256"]) == 64

    scores = [0.05, 0.5, 0.95]
    response = client.post("/calibrate", json={"calibrator": name, "scores": scores})
    assert response.status_code == 200
    body = response.json()
    assert body["calibrator"] == name and body["version"] == 1

    # The served probabilities are those of the stored parameters, rebuilt offline.
    stored = client.get(f"/calibrators/{name}/versions/1").json()
    offline = from_dict(stored["parameters"]).predict(np.array(scores))
    np.testing.assert_allclose(body["probabilities"], offline, rtol=0, atol=1e-15)
    # ... and those of an independent Platt fit (scikit-learn, unregularised).
    from sklearn.linear_model import LogisticRegression

    z = np.log(np.array(data["scores"]) / (1 - np.array(data["scores"])))
    reference = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(z[:, None], data["labels"])
    expected = reference.predict_proba(np.log(np.array(scores) / (1 - np.array(scores)))[:, None])[:, 1]
    np.testing.assert_allclose(body["probabilities"], expected, atol=1e-6)


def test_same_holdout_same_fingerprint(client, name):
    data = holdout(seed=3)
    first = fit(client, name, holdout=data)
    second = fit(client, name, holdout=data, method="temperature")
    assert first["holdout_sha256"] == second["holdout_sha256"]
    other = fit(client, name, holdout=holdout(seed=4))
    assert other["holdout_sha256"] != first["holdout_sha256"]


def test_versions_promote_and_rollback(client, name):
    fit(client, name, holdout=holdout(seed=1))
    fit(client, name, holdout=holdout(seed=2))
    third = fit(client, name, holdout=holdout(seed=3), promote=False)
    assert third["version"] == 3 and third["current"] is False

    def served(version=None):
        body = client.post("/calibrate", json={"calibrator": name, "version": version, "scores": [0.3]}).json()
        return body["version"], body["probabilities"][0]

    assert served()[0] == 2  # promote: false left version 2 current
    by_version = {v: served(v)[1] for v in (1, 2, 3)}
    assert len(set(by_version.values())) == 3

    response = client.post(f"/calibrators/{name}/promote", json={"version": 1})
    assert response.status_code == 200 and response.json()["current_version"] == 1
    assert served() == (1, by_version[1])  # rolled back, served on the next request

    detail = client.get(f"/calibrators/{name}").json()
    assert detail["current_version"] == 1 and detail["latest_version"] == 3
    assert detail["latest"]["version"] == 3
    assert [(v["version"], v["current"]) for v in detail["versions"]] == [(1, True), (2, False), (3, False)]

    missing = client.post(f"/calibrators/{name}/promote", json={"version": 9})
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


def test_first_fit_without_promotion_has_no_current_version(client, name):
    fit(client, name, promote=False)
    response = client.post("/calibrate", json={"calibrator": name, "scores": [0.3]})
    assert response.status_code == 409
    assert "no current version" in response.json()["detail"]
    assert client.post("/calibrate", json={"calibrator": name, "version": 1, "scores": [0.3]}).status_code == 200


def test_version_details_include_parameters_and_summary(client, name):
    fit(client, name)
    body = client.get(f"/calibrators/{name}/versions/1").json()
    assert body["parameters"]["method"] == "platt"
    assert set(body["parameters"]["state"]) == {"a_", "b_"}
    assert body["summary"]["cross_fit"] == {"n_splits": 5, "seed": 0, "of": "the whole fit"}
    assert client.get(f"/calibrators/{name}/versions/2").status_code == 404


def test_delete_removes_everything_and_the_name_starts_over(client, name, row_counts):
    fit(client, name, holdout=holdout(seed=1))
    fit(client, name, holdout=holdout(seed=2))
    old = client.post("/calibrate", json={"calibrator": name, "scores": [0.3]}).json()["probabilities"]
    before = row_counts()
    assert client.delete(f"/calibrators/{name}").status_code == 204
    after = row_counts()
    assert after["calibrators"] == before["calibrators"] - 1
    assert after["calibrator_versions"] == before["calibrator_versions"] - 2
    assert client.get(f"/calibrators/{name}").status_code == 404
    assert client.post("/calibrate", json={"calibrator": name, "scores": [0.3]}).status_code == 404
    assert client.delete(f"/calibrators/{name}").status_code == 404

    # Re-created, the name starts again at version 1, and nothing of the old one is served.
    created = fit(client, name, holdout=holdout(seed=7), method="temperature")
    assert created["version"] == 1
    new = client.post("/calibrate", json={"calibrator": name, "scores": [0.3]}).json()["probabilities"]
    assert new != old


def test_delete_removes_the_feedback_even_while_feedback_arrives(client, name, row_counts):
    # Feedback rows keep no foreign key (PostgreSQL would check it per row): deleting a calibrator
    # deletes them itself, and a feedback write racing the delete either lands before it (and is
    # deleted with it) or finds the calibrator gone (404). No row outlives its calibrator.
    fit(client, name, holdout=holdout(seed=3))
    rng = np.random.default_rng(5)
    body = {"calibrator": name, "probabilities": rng.uniform(0.05, 0.95, 2_000).tolist(),
            "labels": rng.integers(0, 2, 2_000).tolist()}
    assert client.post("/feedback", json=body).status_code == 202
    statuses: list[int] = []
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=60) as other:
            while not stop.is_set():
                status = other.post("/feedback", json=body).status_code
                statuses.append(status)
                if status == 404:
                    return

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 60
    while not statuses and time.monotonic() < deadline:  # the delete races writes that are under way
        time.sleep(0.05)
    assert client.delete(f"/calibrators/{name}").status_code == 204
    stop.set()
    for sender in senders:
        sender.join()
    assert set(statuses) <= {202, 404} and 202 in statuses, statuses
    with row_counts.engine.connect() as connection:
        orphans = connection.execute(text(
            "SELECT count(*) FROM feedback WHERE calibrator_id NOT IN (SELECT id FROM calibrators)")).scalar_one()
    assert orphans == 0


def test_list_is_paginated(client):
    prefix = f"page-{np.random.default_rng().integers(1 << 30):x}"
    names = [f"{prefix}-{i}" for i in range(5)]
    for n in names:
        fit(client, n)
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/calibrators", params=params).json()
        assert len(page["items"]) <= 2
        seen += [item["name"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [n for n in seen if n.startswith(prefix)] == names
    assert seen == sorted(seen)
    item = next(i for i in client.get("/calibrators", params={"limit": 1000}).json()["items"] if i["name"] == names[0])
    assert item["method"] == "platt" and item["current_version"] == 1 and item["n_classes"] == 2


def test_csv_upload_fits_the_same_calibrator_as_json(client, name):
    data = holdout(seed=5)
    weights = np.linspace(0.5, 2.0, 400).tolist()
    rows = "\n".join(f"{y},{s!r},{w!r}" for y, s, w in zip(data["labels"], data["scores"], weights))
    csv = f"label,score,weight\n{rows}\n"
    response = client.post(
        "/calibrators",
        data={"name": name, "method": "platt", "input": "probability", "options": "{}"},
        files={"file": ("holdout.csv", csv, "text/csv")},
    )
    assert response.status_code == 201, response.text
    from_csv = response.json()
    from_json = fit(client, name, holdout=data | {"sample_weight": weights})
    assert from_csv["holdout_sha256"] == from_json["holdout_sha256"]
    assert untimed(from_csv["summary"]) == untimed(from_json["summary"])


def test_logit_input(client, name):
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, 500)
    labels = (rng.uniform(size=500) < 1 / (1 + np.exp(-z / 3))).astype(int)
    created = fit(client, name, method="temperature", input="logit", holdout={"scores": z.tolist(), "labels": labels.tolist()})
    assert created["input"] == "logit"
    assert created["summary"]["fit"]["temperature"] == pytest.approx(3, rel=0.3)
    body = client.post("/calibrate", json={"calibrator": name, "scores": [-20.0, 0.0, 20.0]}).json()
    assert body["probabilities"][1] == pytest.approx(0.5)
    assert 0 < body["probabilities"][0] < 0.5 < body["probabilities"][2] < 1


def test_auto_records_what_it_picked_and_why(client, name):
    created = fit(client, name, method="auto", options={"candidates": ["platt", "temperature"]})
    info = created["summary"]["fit"]
    assert info["chosen"] in ("platt", "temperature")
    assert set(info["cv_log_loss"]) == {"platt", "temperature"}
    assert info["chosen"] == min(info["cv_log_loss"], key=info["cv_log_loss"].get)
    assert "log-loss" in info["reason"]


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok", "version": metadata.version("calibd")}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_openapi_documents_the_routes(client):
    spec = client.get("/openapi.json").json()
    for path in ("/calibrators", "/calibrate", "/calibrators/{name}/promote", "/healthz", "/readyz"):
        assert path in spec["paths"]
    body = spec["paths"]["/calibrators"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(body)


def test_venn_abers_adds_intervals_around_each_probability(client, name):
    fit(client, name, method="venn_abers")
    body = client.post("/calibrate", json={"calibrator": name, "scores": [0.1, 0.5, 0.9]}).json()
    assert len(body["intervals"]) == 3
    for p, (low, high) in zip(body["probabilities"], body["intervals"]):
        assert 0 <= low <= p <= high <= 1


# -- large JSON bodies are spooled to a file for the fit worker ------------------------------------
def _spooled_files() -> set[str]:
    from calibd.workers.spool import SPOOL_DIR

    folder = SPOOL_DIR or tempfile.gettempdir()
    return {entry for entry in os.listdir(folder) if entry.startswith("calibd-fit-")}


def test_a_large_json_body_fits_as_a_small_one_and_its_spool_is_removed(client, name):
    from calibd.workers.spool import SPOOL_MIN_BYTES
    from calibd.calibration.isotonic import IsotonicCalibrator

    data = holdout(n=80_000, seed=7)
    body = {"name": name, "method": "isotonic", "holdout": data}
    assert len(json.dumps(body)) > SPOOL_MIN_BYTES
    before = _spooled_files()
    created = client.post("/calibrators", json=body)
    assert created.status_code == 201, created.text
    stored = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    reference = IsotonicCalibrator().fit(np.array(data["scores"]), np.array(data["labels"])).to_dict()
    for key in ("x_thresholds_", "y_thresholds_"):
        np.testing.assert_array_equal(stored["state"][key], reference["state"][key])
    # Asynchronously too; and neither leaves its spooled body behind.
    accepted = client.post("/calibrators", params={"async": "true"}, json=body)
    assert accepted.status_code == 202, accepted.text
    deadline = time.monotonic() + 120
    while (job := client.get(accepted.headers["Location"]).json())["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert job["state"] == "succeeded" and job["result"]["version"] == 2
    # Another process's spool files (a test run beside this one) may come and go meanwhile: what this
    # server leaked would stay.
    deadline = time.monotonic() + 10
    while (left := _spooled_files() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == set()


def test_spool_json_body_spools_large_bodies_and_keeps_small_ones_in_memory():
    from calibd.workers.spool import SPOOL_MIN_BYTES, spool_json_body

    async def chunks(data: bytes, size: int = 65_536):
        for start in range(0, len(data), size):
            yield data[start:start + size]

    large = bytes(range(256)) * (SPOOL_MIN_BYTES // 256 + 7)
    job = asyncio.run(spool_json_body(chunks(large), len(large), 10))
    try:
        assert job.body is None and job.max_samples == 10
        with open(job.body_file, "rb") as spooled:
            assert spooled.read() == large
    finally:
        job.discard_spool()
    assert not os.path.exists(job.body_file)
    small = b'{"name": "x"}'
    assert asyncio.run(spool_json_body(chunks(small), len(small), None)).body == small
    # No length given, or more than the spool has room for: read into memory.
    assert asyncio.run(spool_json_body(chunks(large), None, None)).body == large
    assert asyncio.run(spool_json_body(chunks(large), 1 << 60, None)).body == large


def test_a_fit_answers_briefly_and_gives_the_whole_summary_when_asked(client, name):
    rows = holdout(n=14, seed=1)
    created = client.post("/calibrators", json={"name": name, "method": "platt", "holdout": rows})
    assert created.status_code == 201, created.text
    brief = created.json()
    assert set(brief["summary"]) == {"before", "after", "fit", "timings"}
    timings = brief["summary"]["timings"]
    # parse: reading the body; wait: for a fit worker; cross_fit: the summary's 5 refits
    assert set(timings) == {"parse", "validate", "fit", "cross_fit", "summary", "wait"}
    assert all(v >= 0 for v in timings.values())
    assert sum(timings.values()) == pytest.approx(brief["fit_seconds"], rel=1e-9)
    assert set(brief["summary"]["after"]) == {"ece", "brier", "log_loss"}
    assert set(brief["summary"]["fit"]) == {"a", "b"}
    assert brief["version"] == 1 and brief["method"] == "platt" and brief["n_samples"] == 14
    assert len(created.content) < 2048, len(created.content)

    stored = client.get(created.headers["Location"]).json()
    assert {key: stored["summary"][key] for key in ("before", "after", "fit", "timings")} == brief["summary"]
    assert {"holdout", "cross_fit"} <= set(stored["summary"])
    full = client.post("/calibrators", params={"detail": "full"}, json={"name": name, "method": "platt", "holdout": rows})
    assert full.status_code == 201, full.text
    assert untimed(full.json()["summary"]) == untimed(stored["summary"])  # the same rows give the same summary
    assert client.post("/calibrators", params={"detail": "all"}, json={"name": name, "method": "platt",
                                                                     "holdout": rows}).status_code == 422


def untimed(summary: dict) -> dict:
    """A fit summary without its measured durations, which differ from one fit to the next."""
    return {key: value for key, value in summary.items() if key != "timings"}
