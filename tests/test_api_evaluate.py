"""POST /evaluate: every metric for binary and multiclass input, 422s that point at the bad field, nothing stored."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibd.metrics import DEFAULT_METRICS, evaluate

rng = np.random.default_rng(0)
BINARY_P = rng.random(400)
BINARY_Y = (rng.random(400) < BINARY_P**1.2).astype(int)
_logits = rng.normal(size=(300, 3))
MULTI_P = np.exp(_logits) / np.exp(_logits).sum(axis=1, keepdims=True)
MULTI_Y = (MULTI_P.cumsum(axis=1) < rng.random((300, 1))).sum(axis=1)


def post(client, body: dict):
    # json.dumps writes NaN and Infinity literals, as Python clients do.
    return client.post("/evaluate", content=json.dumps(body), headers={"content-type": "application/json"})


def test_binary_request_returns_every_metric(client, row_counts):
    before = row_counts()
    body = {"probabilities": BINARY_P.tolist(), "labels": BINARY_Y.tolist()}
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert set(result) == {"metrics", "reliability"}
    assert list(result["metrics"]) == list(DEFAULT_METRICS)
    expected = evaluate(BINARY_P.tolist(), BINARY_Y.tolist())
    for name, entry in result["metrics"].items():
        assert entry["value"] == pytest.approx(expected["metrics"][name]["value"], rel=1e-12), name
        assert entry["ci"] is None
    assert result["metrics"]["ece"]["params"]["bins"].startswith("left-closed")
    assert 0 <= result["metrics"]["spiegelhalter_z"]["p_value"] <= 1
    bins = result["reliability"]["bins"]
    assert len(bins) == 15 and bins[0]["lower"] == 0.0 and bins[-1]["upper"] == 1.0
    assert sum(b["count"] for b in bins) == 400
    assert all(b["wilson"][0] <= b["observed_frequency"] <= b["wilson"][1] for b in bins if b["count"])
    assert row_counts() == before


def test_multiclass_request_with_weights_options_and_bootstrap(client, row_counts):
    before = row_counts()
    weights = rng.random(300).tolist()
    body = {
        "probabilities": MULTI_P.tolist(),
        "labels": MULTI_Y.tolist(),
        "sample_weight": weights,
        "metrics": None,
        "options": {
            "n_bins": 10,
            "binning": "quantile",
            "norm": "l2",
            "target": None,
            "lambda": 5,
            "bootstrap": {"n_resamples": 50, "seed": 3, "level": 0.9},
        },
    }
    response = post(client, body)
    assert response.status_code == 200, response.text
    metrics = response.json()["metrics"]
    assert list(metrics) == list(DEFAULT_METRICS)
    expected = {"n_bins": 10, "binning": "quantile", "norm": "l2", "target": "top_label"}
    assert {key: metrics["ece"]["params"][key] for key in expected} == expected
    assert metrics["lp_error_2"]["params"]["lambda"] == 5
    for name, entry in metrics.items():
        low, high = entry["ci"]
        assert low <= high, name
        assert entry["params"]["bootstrap"] == {"n_resamples": 50, "seed": 3, "level": 0.9, "interval": "percentile"}
    bins = response.json()["reliability"]["bins"]
    assert all("effective_count" in b for b in bins)
    assert row_counts() == before


def test_classwise_and_selected_metrics(client):
    body = {
        "probabilities": MULTI_P.tolist(),
        "labels": MULTI_Y.tolist(),
        "metrics": ["ece", "brier", "lp_error_inf"],
        "options": {"target": "classwise"},
    }
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert list(result["metrics"]) == ["ece", "brier", "lp_error_inf"]
    assert [c["class"] for c in result["reliability"]["classes"]] == [0, 1, 2]
    assert set(result["metrics"]["brier"]["decomposition"]) >= {"reliability", "resolution", "uncertainty"}


def _rows(index: int, row) -> list:
    rows = MULTI_P[:10].tolist()
    rows[index] = row
    return rows


def _flat(index: int, value) -> list:
    values = BINARY_P[:10].tolist()
    values[index] = value
    return values


LABELS10 = BINARY_Y[:10].tolist()
MLABELS10 = MULTI_Y[:10].tolist()

# (case, body, pointer)
BAD = [
    ("nan", {"probabilities": _flat(3, float("nan")), "labels": LABELS10}, "/probabilities/3"),
    ("inf", {"probabilities": _flat(4, float("inf")), "labels": LABELS10}, "/probabilities/4"),
    ("above 1", {"probabilities": _flat(5, 1.5), "labels": LABELS10}, "/probabilities/5"),
    ("below 0", {"probabilities": _flat(6, -0.01), "labels": LABELS10}, "/probabilities/6"),
    ("string", {"probabilities": _flat(2, "0.3"), "labels": LABELS10}, "/probabilities/2"),
    ("null element", {"probabilities": _flat(1, None), "labels": LABELS10}, "/probabilities/1"),
    ("nan in a row", {"probabilities": _rows(3, [0.5, float("nan"), 0.5]), "labels": MLABELS10}, "/probabilities/3/1"),
    ("negative in a row", {"probabilities": _rows(2, [0.6, 0.5, -0.1]), "labels": MLABELS10}, "/probabilities/2/2"),
    ("row not summing to 1", {"probabilities": _rows(4, [0.5, 0.3, 0.1]), "labels": MLABELS10}, "/probabilities/4"),
    ("ragged rows", {"probabilities": _rows(5, [0.5, 0.5]), "labels": MLABELS10}, "/probabilities/5"),
    ("one column", {"probabilities": [[1.0]] * 10, "labels": LABELS10}, "/probabilities"),
    ("three dimensions", {"probabilities": [[[0.5, 0.5]]] * 10, "labels": LABELS10}, "/probabilities"),
    ("empty", {"probabilities": [], "labels": []}, "/probabilities"),
    ("not a list", {"probabilities": 0.5, "labels": [1]}, "/probabilities"),
    ("missing probabilities", {"labels": LABELS10}, "/probabilities"),
    ("missing labels", {"probabilities": _flat(0, 0.1)}, "/labels"),
    ("length mismatch", {"probabilities": _flat(0, 0.1), "labels": LABELS10[:9]}, "/labels"),
    ("binary label 2", {"probabilities": _flat(0, 0.1), "labels": LABELS10[:7] + [2] + LABELS10[8:]}, "/labels/7"),
    ("class out of range", {"probabilities": MULTI_P[:10].tolist(), "labels": [0] * 9 + [3]}, "/labels/9"),
    ("fractional label", {"probabilities": _flat(0, 0.1), "labels": [0.5] + LABELS10[1:]}, "/labels/0"),
    ("negative weight", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "sample_weight": [1] * 8 + [-1, 1]}, "/sample_weight/8"),
    ("weights mismatch", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "sample_weight": [1, 2]}, "/sample_weight"),
    ("unknown metric", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "metrics": ["ece", "accuracy"]}, "/metrics/1"),
    ("metrics not a list", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "metrics": "ece"}, "/metrics"),
    ("unknown option", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"bins": 10}}, "/options/bins"),
    ("bad n_bins", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"n_bins": 0}}, "/options/n_bins"),
    ("n_bins not an integer", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"n_bins": 2.5}}, "/options/n_bins"),
    ("bad binning", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"binning": "log"}}, "/options/binning"),
    ("bad norm", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"norm": "l3"}}, "/options/norm"),
    ("binary target on 3 classes", {"probabilities": MULTI_P[:10].tolist(), "labels": MLABELS10, "options": {"target": "binary"}}, "/options/target"),
    ("bad lambda", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"lambda": -2}}, "/options/lambda"),
    ("options not an object", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": [1]}, "/options"),
    ("bad bootstrap level", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"bootstrap": {"level": 1.5}}}, "/options/bootstrap/level"),
    ("bootstrap too much work", {"probabilities": BINARY_P.tolist(), "labels": BINARY_Y.tolist(), "options": {"bootstrap": {"n_resamples": 30_000}}}, "/options/bootstrap/n_resamples"),
    ("bootstrap too many resamples", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "options": {"bootstrap": {"n_resamples": 10**6}}}, "/options/bootstrap/n_resamples"),
    ("unknown field", {"probabilities": _flat(0, 0.1), "labels": LABELS10, "weights": [1] * 10}, "/weights"),
]


@pytest.mark.parametrize("case,body,at", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_a_422_pointing_at_the_field(client, row_counts, case, body, at):
    before = row_counts()
    response = post(client, body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422 and problem["detail"]
    assert [e["pointer"] for e in problem["errors"]] == [at], problem
    assert row_counts() == before


def test_not_json_and_wrong_content_type(client):
    response = client.post("/evaluate", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400
    response = client.post("/evaluate", content=b"[1]", headers={"content-type": "application/json"})
    assert response.status_code == 400
    response = client.post("/evaluate", content=b"a=b", headers={"content-type": "text/plain"})
    assert response.status_code == 415


def test_documented_in_openapi(client):
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/evaluate"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"probabilities", "labels", "sample_weight", "metrics", "options"} <= set(schema["properties"])
    assert "200" in operation["responses"] and "422" in operation["responses"]
