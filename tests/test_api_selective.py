"""The selective method through the API: fit with features, calibrate with features, `accepted` flags."""

from __future__ import annotations

import io
import json
import time
import uuid

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from calibd.calibration import from_dict
from tests.test_selective import section6

# A quick selector, enough for the section-6 case.
OPTIONS = {"beta": 0.8, "mode": "joint", "hidden": [16, 16], "epochs": 30}


def fit_body(name: str, n: int = 1200, seed: int = 0, options: dict | None = None) -> dict:
    scores, labels, features, _, _ = section6(n, np.random.default_rng(seed))
    return {
        "name": name,
        "method": "selective",
        "options": OPTIONS if options is None else options,
        "holdout": {"scores": scores.tolist(), "labels": labels.tolist(), "features": features.tolist()},
    }


@pytest.fixture(scope="module")
def fitted_once(server):
    """One fit per database, shared by the tests that only read it."""
    name = f"test-selective-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=server.url, timeout=120) as http:
        created = http.post("/calibrators", json=fit_body(name), params={"detail": "full"})
    assert created.status_code == 201, created.text
    return name, created.json()


def test_fit_and_calibrate_with_features_gives_accepted_flags_at_the_reported_rate(client, fitted_once):
    name, fitted = fitted_once
    summary = fitted["summary"]
    coverage = summary["fit"]["coverage"]
    assert coverage["target"] == 0.8 and coverage["n_rows"] == 300
    low, high = coverage["interval"]
    selective = summary["selective"]
    for method in ("selective_recalibration", "recalibration_alone", "confidence_rejection", "isolation_forest"):
        assert {"coverage", "ece", "brier", "accuracy_accepted", "accuracy_all"} <= set(selective[method])

    scores, _, features, _, inlier = section6(4000, np.random.default_rng(99))
    response = client.post("/calibrate", json={"calibrator": name, "scores": scores.tolist(), "features": features.tolist()})
    assert response.status_code == 200, response.text
    served = response.json()
    accepted = np.array(served["accepted"])
    assert accepted.dtype == bool and accepted.shape == (4000,)
    assert len(served["probabilities"]) == 4000  # rejected rows get a probability too
    assert low <= accepted.mean() <= high, (accepted.mean(), low, high)
    assert inlier[accepted].mean() > 0.9

    stored = from_dict(client.get(f"/calibrators/{name}/versions/1").json()["parameters"])
    probabilities, extras = stored.predict_details(scores, features=features)
    np.testing.assert_array_equal(served["probabilities"], probabilities)
    np.testing.assert_array_equal(accepted, extras["accepted"])


def test_accepted_flags_are_logged_with_predictions(client, fitted_once, row_counts):
    name = fitted_once[0]
    scores, labels, features, _, _ = section6(50, np.random.default_rng(5))
    ids = [f"{name}-{i}" for i in range(50)]
    served = client.post(
        "/calibrate", json={"calibrator": name, "scores": scores.tolist(), "features": features.tolist(), "ids": ids}
    ).json()
    deadline = time.monotonic() + 15
    rows: list = []
    while time.monotonic() < deadline:
        with row_counts.engine.connect() as connection:
            rows = connection.execute(
                text("SELECT prediction_id, accepted FROM predictions WHERE prediction_id LIKE :prefix"),
                {"prefix": f"{name}-%"},
            ).all()
        if len(rows) == 50:
            break
        time.sleep(0.1)
    assert len(rows) == 50
    logged = {row[0]: bool(row[1]) for row in rows}
    assert [logged[i] for i in ids] == served["accepted"]

    # Feedback by id: the monitors see calibration on accepted rows and the acceptance rate of all.
    receipt = client.post("/feedback", json={"calibrator": name, "ids": ids, "labels": labels.tolist()})
    assert receipt.status_code == 202 and receipt.json()["count"] == 50, receipt.text
    window = client.get(f"/calibrators/{name}/monitor").json()["windows"]["24h"]
    assert window["acceptance_rate"] == pytest.approx(np.mean(served["accepted"]))
    assert window["samples"] == sum(served["accepted"])


def test_calibrate_without_features_is_a_422_at_features_and_logs_nothing(client, fitted_once, row_counts):
    name = fitted_once[0]
    scores, _, features, _, _ = section6(20, np.random.default_rng(6))
    before = row_counts()
    cases = [
        ({"scores": scores.tolist(), "ids": [f"x{i}" for i in range(20)]}, "/features"),
        ({"scores": scores.tolist(), "features": features[:, :3].tolist()}, "/features/0"),
        ({"scores": scores.tolist(), "features": features[:5].tolist()}, "/features"),
        ({"scores": scores.tolist(), "features": features.tolist(), "embedding": [1.0]}, "/embedding"),
    ]
    for body, pointer in cases:
        response = client.post("/calibrate", json={"calibrator": name, **body})
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert pointer in [error["pointer"] for error in response.json()["errors"]], response.json()
    time.sleep(0.5)  # the prediction log writes behind the hot path
    assert row_counts() == before


def test_npz_upload_fit(client, name):
    scores, labels, features, _, _ = section6(800, np.random.default_rng(1))
    buffer = io.BytesIO()
    np.savez(buffer, scores=scores, labels=labels, features=features)
    response = client.post(
        "/calibrators",
        data={"name": name, "method": "selective", "options": '{"beta": 0.7, "hidden": [8], "epochs": 10}'},
        files={"file": ("holdout.npz", buffer.getvalue(), "application/octet-stream")},
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["summary"]["fit"]["coverage"]["target"] == 0.7
    assert created["summary"]["fit"]["selector_input"] == "features"
    served = client.post("/calibrate", json={"calibrator": name, "scores": scores[:10].tolist(), "features": features[:10].tolist()})
    assert served.status_code == 200 and len(served.json()["accepted"]) == 10


def test_scores_only_fit_and_calibrate(client, name):
    body = fit_body(name, n=400, options={"beta": 0.9, "hidden": [8], "epochs": 10})
    del body["holdout"]["features"]
    assert client.post("/calibrators", json=body).status_code == 201
    served = client.post("/calibrate", json={"calibrator": name, "scores": [0.1, 0.5, 0.9]})
    assert served.status_code == 200 and len(served.json()["accepted"]) == 3
    refused = client.post("/calibrate", json={"calibrator": name, "scores": [0.1], "features": [[1.0, 2.0, 3.0, 4.0]]})
    assert refused.status_code == 422 and refused.json()["errors"][0]["pointer"] == "/features"


@pytest.mark.parametrize(
    "change, pointer",
    [
        ({"options": {"beta": 1.5}}, "/options/beta"),
        ({"options": {"beta": 0}}, "/options/beta"),
        ({"options": {"mode": "together"}}, "/options/mode"),
        ({"holdout_features": "short"}, "/holdout/features"),
        ({"holdout_features": "nan"}, "/holdout/features/3/1"),
    ],
)
def test_bad_fit_is_a_422_and_writes_nothing(client, name, row_counts, change, pointer):
    body = fit_body(name, n=100, options=dict(OPTIONS))
    if "options" in change:
        body["options"] = {**body["options"], **change["options"]}
    elif change["holdout_features"] == "short":
        body["holdout"]["features"] = body["holdout"]["features"][:-1]
    else:
        body["holdout"]["features"][3][1] = float("nan")
    before = row_counts()
    # json.dumps writes NaN literals, as Python clients do.
    response = client.post("/calibrators", content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert pointer in [error["pointer"] for error in response.json()["errors"]], response.json()
    assert row_counts() == before
