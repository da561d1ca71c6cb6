"""POST /evaluate with segments: the metrics per segment, and the multicalibration metrics equal to mcgrad 0.1.5's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibd.metrics import evaluate

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "mcgrad_multicalibration.json").read_text())
CASES = {case["seed"]: case for case in FIXTURES["cases"]}
OPTION_NAMES = {"max_values_per_segment_feature": "max_values", "max_depth": "max_depth",
                "min_samples_per_segment": "min_samples", "max_n_segments": "max_segments"}


def post(client, body: dict):
    return client.post("/evaluate", content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_multicalibration_equals_mcgrad_over_http(client, seed):
    case = CASES[seed]
    body = {
        "probabilities": case["probabilities"],
        "labels": case["labels"],
        "sample_weight": case["sample_weight"],
        "segments": case["segments"],
        "metrics": ["ece", "log_loss"],
        "options": {"multicalibration": {OPTION_NAMES[k]: v for k, v in case["options"].items()}},
    }
    response = post(client, body)
    assert response.status_code == 200, response.text
    got, expected = response.json()["multicalibration"], case["expected"]
    assert got["global"]["ecce"] == pytest.approx(expected["global_ecce"], abs=1e-9)
    assert got["global"]["sigma"] == pytest.approx(expected["global_ecce_sigma"], abs=1e-9)
    assert got["global"]["p_value"] == pytest.approx(expected["global_ecce_pvalue"], abs=1e-9)
    assert got["mce"] == pytest.approx(expected["mce"], abs=1e-9)
    assert got["mce_sigma"] == pytest.approx(expected["mce_sigma"], abs=1e-9)
    assert got["mce_p_value"] == pytest.approx(expected["mce_pvalue"], abs=1e-9)
    assert got["n_segments"] == len(expected["segments"])
    for mine, theirs in zip(got["segments"], expected["segments"], strict=True):
        assert mine["values"] == theirs["values"]
        assert (mine["ecce"], mine["sigma"], mine["p_value"]) == pytest.approx(
            (theirs["ecce"], theirs["sigma"], theirs["p_value"]), abs=1e-9)


def test_every_metric_per_segment_is_the_metric_of_its_rows(client, row_counts):
    before = row_counts()
    case = CASES[2]
    p, y, w = (np.array(case[k]) for k in ("probabilities", "labels", "sample_weight"))
    country = np.array(case["segments"]["country"])
    body = {"probabilities": p.tolist(), "labels": y.tolist(), "sample_weight": w.tolist(),
            "segments": {"country": country.tolist()}, "options": {"n_bins": 10, "segment_values": 3}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    result = response.json()
    entries = result["segments"]["country"]
    # the 3 most frequent countries, then the other two pooled
    values, counts = np.unique(country, return_counts=True)
    top = [str(v) for v in values[np.argsort(-counts, kind="stable")][:3]]
    assert [e["value"] for e in entries] == [*top, "__OTHER"]
    assert sum(e["count"] for e in entries) == len(p)
    for entry in entries:
        rows = ~np.isin(country, top) if entry["value"] == "__OTHER" else country == entry["value"]
        assert entry["count"] == rows.sum()
        assert entry["weight"] == pytest.approx(w[rows].sum(), rel=1e-12)
        alone = evaluate(p[rows].tolist(), y[rows].tolist(), w[rows].tolist(), options={"n_bins": 10})
        assert set(entry["metrics"]) == set(result["metrics"])
        for name, metric in entry["metrics"].items():
            assert metric["value"] == pytest.approx(alone["metrics"][name]["value"], rel=1e-12, abs=1e-15), name
    assert row_counts() == before


def test_multiclass_top_label_has_multicalibration_and_classwise_has_none(client):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(600, 3))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = rng.integers(0, 3, 600)
    group = rng.choice(["a", "b"], 600)
    body = {"probabilities": probabilities.tolist(), "labels": labels.tolist(), "segments": {"g": group.tolist()},
            "metrics": ["ece"]}
    result = post(client, body).json()
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == labels).astype(int)
    alone = post(client, {"probabilities": confidence.tolist(), "labels": correct.tolist(),
                          "segments": {"g": group.tolist()}, "metrics": ["ece"]}).json()
    assert result["multicalibration"]["params"]["target"] == "top_label"
    assert result["multicalibration"]["mce_sigma"] == pytest.approx(alone["multicalibration"]["mce_sigma"], rel=1e-12)
    body["options"] = {"target": "classwise"}
    result = post(client, body).json()
    assert result["multicalibration"] is None and set(result["segments"]["g"][0]["metrics"]) == {"ece"}


def test_small_segments_get_metrics_or_nulls_not_errors(client):
    body = {"probabilities": [0.1, 0.9, 0.4, 0.6, 0.3], "labels": [0, 1, 1, 0, 0], "sample_weight": [1, 1, 1, 1, 0],
            "segments": {"g": ["a", "a", "a", "a", "b"]}}
    response = post(client, body)
    assert response.status_code == 200, response.text
    alone = response.json()["segments"]["g"][1]
    assert alone["count"] == 1 and alone["weight"] == 0
    assert all(m["value"] is None for m in alone["metrics"].values())  # no weight: undefined


N = 10
BASE = {"probabilities": [0.1 * i for i in range(N)], "labels": [0, 1] * 5}
BAD = [
    ("not an object", {"segments": ["a"] * N}, "/segments"),
    ("bad column name", {"segments": {"a b": ["x"] * N}}, "/segments"),
    ("wrong length", {"segments": {"country": ["br"] * (N - 1)}}, "/segments/country"),
    ("not a list", {"segments": {"country": "br"}}, "/segments/country"),
    ("non-string value", {"segments": {"country": ["br"] * 3 + [7] + ["br"] * 6}}, "/segments/country/3"),
    ("null value", {"segments": {"country": ["br"] * 9 + [None]}}, "/segments/country/9"),
    ("bad multicalibration option", {"segments": {"c": ["x"] * N}, "options": {"multicalibration": {"max_depth": -1}}},
     "/options/multicalibration/max_depth"),
    ("unknown multicalibration option", {"segments": {"c": ["x"] * N}, "options": {"multicalibration": {"depth": 1}}},
     "/options/multicalibration/depth"),
    ("segment_values out of range", {"segments": {"c": ["x"] * N}, "options": {"segment_values": 0}}, "/options/segment_values"),
    ("bootstrap work counts segment columns", {"segments": {"c": ["x"] * N}, "options": {"bootstrap": {"n_resamples": 600_000}}},
     "/options/bootstrap/n_resamples"),
]


@pytest.mark.parametrize("case,extra,at", BAD, ids=[c[0] for c in BAD])
def test_bad_segments_are_422s_naming_the_field(client, row_counts, case, extra, at):
    before = row_counts()
    response = post(client, {**BASE, **extra})
    assert response.status_code == 422, response.text
    assert [e["pointer"] for e in response.json()["errors"]] == [at]
    assert row_counts() == before


def test_documented_in_openapi(client):
    spec = client.get("/openapi.json").json()
    schema = spec["paths"]["/evaluate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "segments" in schema["properties"]
