"""Properties every registered method must have, and each one served through the API."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibd.calibration import METHODS, from_dict, get_method

# Methods that calibrate binary scores alone (no required extra arrays).
BINARY_METHODS = sorted(
    name
    for name, cls in METHODS.items()
    if "binary" in cls.tasks and not any(spec.required for spec in cls.fit_arrays.values())
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(BINARY_METHODS),
    input=st.sampled_from(["probability", "logit"]),
    seed=st.integers(0, 2**31),
    n=st.integers(20, 400),
    ties=st.booleans(),
)
def test_outputs_are_probabilities_monotone_where_promised_and_round_trip(method, input, seed, n, ties):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0, 1, n)
    if ties:
        scores = np.round(scores, 1)
    labels = np.r_[[0, 0, 1, 1], (rng.uniform(size=n - 4) < scores[4:]).astype(int)]
    if input == "logit":
        scores = np.log(np.clip(scores, 1e-6, 1 - 1e-6) / (1 - np.clip(scores, 1e-6, 1 - 1e-6))) * 2
    calibrator = get_method(method)(input=input)
    if input not in calibrator.inputs:
        return
    calibrator.fit(scores, labels)
    grid = np.linspace(0, 1, 301) if input == "probability" else np.linspace(-40, 40, 301)
    out = calibrator.predict(grid)
    assert out.shape == grid.shape
    assert np.all((out >= 0) & (out <= 1))
    if calibrator.monotone:
        assert np.all(np.diff(out) >= -1e-12), method
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    np.testing.assert_array_equal(rebuilt.predict(grid), out)
    proba = calibrator.predict_proba(grid)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


@pytest.mark.parametrize("method", BINARY_METHODS)
def test_each_method_is_fitted_and_served_through_the_api(client, name, method):
    if "probability" not in METHODS[method].inputs:
        pytest.skip(f"{method} takes logits only")
    rng = np.random.default_rng(0)
    scores = rng.uniform(0.01, 0.99, 600)
    labels = (rng.uniform(size=600) < scores**2).astype(int)
    body = {"name": name, "method": method, "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    created = client.post("/calibrators", json=body)
    assert created.status_code == 201, created.text
    summary = created.json()["summary"]
    assert summary["after"]["ece"] < summary["before"]["ece"]
    grid = np.linspace(0, 1, 11).tolist()
    served = client.post("/calibrate", json={"calibrator": name, "scores": grid}).json()
    stored = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    np.testing.assert_array_equal(served["probabilities"], from_dict(stored).predict(np.array(grid)))
