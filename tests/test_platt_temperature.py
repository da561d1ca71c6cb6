"""Platt and binary temperature scaling against independent fits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.calibration import _SigmoidCalibration
from sklearn.linear_model import LogisticRegression

from calibd.calibration.platt import PlattCalibrator
from calibd.calibration.registry import from_dict
from calibd.calibration.temperature import TemperatureCalibrator


def data(n=2000, seed=0, slope=0.6, bias=-0.4):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(slope * z + bias)))).astype(int)
    return z, y


def test_platt_matches_unpenalised_logistic_regression():
    z, y = data()
    w = np.random.default_rng(1).uniform(0.2, 3, z.shape[0])
    ours = PlattCalibrator(input="logit").fit(z, y, sample_weight=w)
    reference = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(z[:, None], y, sample_weight=w)
    grid = np.linspace(-6, 6, 61)
    np.testing.assert_allclose(ours.predict(grid), reference.predict_proba(grid[:, None])[:, 1], atol=1e-7)
    assert ours.a_ == pytest.approx(0.6, abs=0.1) and ours.b_ == pytest.approx(-0.4, abs=0.15)


def test_platt_with_smoothed_targets_matches_scikit_learn_sigmoid_calibration():
    z, y = data(n=3000, seed=2)
    ours = PlattCalibrator(input="logit", smooth_targets=True).fit(z, y)
    reference = _SigmoidCalibration().fit(z, y)
    grid = np.linspace(-6, 6, 61)
    np.testing.assert_allclose(ours.predict(grid), reference.predict(grid), atol=1e-6)


def test_platt_on_probabilities_uses_their_logits():
    z, y = data(seed=3)
    p = 1 / (1 + np.exp(-z))
    on_p = PlattCalibrator().fit(p, y)
    on_z = PlattCalibrator(input="logit").fit(z, y)
    np.testing.assert_allclose(on_p.predict(p), on_z.predict(z), atol=1e-9)


def test_platt_survives_scores_of_exactly_zero_and_one():
    p = np.array([0.0, 0.0, 0.1, 0.4, 0.6, 0.9, 1.0, 1.0, 0.3, 0.7])
    y = np.array([0, 0, 0, 1, 0, 1, 1, 1, 0, 1])
    out = PlattCalibrator().fit(p, y).predict(p)
    assert np.all(np.isfinite(out)) and np.all((out >= 0) & (out <= 1))


def test_temperature_recovers_a_known_temperature():
    rng = np.random.default_rng(4)
    true_t = 2.5
    z = rng.normal(0, 4, 50_000)
    y = (rng.uniform(size=z.shape[0]) < 1 / (1 + np.exp(-z / true_t))).astype(int)
    fitted = TemperatureCalibrator(input="logit").fit(z, y)
    assert fitted.temperature_ == pytest.approx(true_t, rel=0.03)


def test_temperature_is_the_maximum_likelihood_slope_without_bias():
    z, y = data(seed=5, bias=0.0)
    fitted = TemperatureCalibrator(input="logit").fit(z, y)
    reference = LogisticRegression(C=1e12, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(z[:, None], y)
    assert 1 / fitted.temperature_ == pytest.approx(reference.coef_[0, 0], rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**31),
    st.sampled_from([PlattCalibrator, TemperatureCalibrator]),
    st.sampled_from(["probability", "logit"]),
)
def test_outputs_are_probabilities_monotone_and_survive_a_round_trip(seed, cls, input):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 300))
    scores = rng.uniform(0, 1, n) if input == "probability" else rng.normal(0, 5, n)
    labels = np.r_[[0, 0, 1, 1], rng.integers(0, 2, n - 4)]
    calibrator = cls(input=input).fit(scores, labels)
    grid = np.linspace(0, 1, 201) if input == "probability" else np.linspace(-30, 30, 201)
    out = calibrator.predict(grid)
    assert np.all((out >= 0) & (out <= 1))
    if getattr(calibrator, "a_", 1.0) >= 0:
        assert np.all(np.diff(out) >= 0)
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    np.testing.assert_array_equal(rebuilt.predict(grid), out)


def test_temperature_gives_each_row_the_same_answer_in_any_batch():
    """A logit row far out (shifted softmax) does not change the other rows' bits (unshifted)."""
    rng = np.random.default_rng(5)
    z = rng.normal(0.0, 3.0, (300, 4))
    labels = np.array([rng.choice(4, p=np.exp(r) / np.exp(r).sum()) for r in z])
    calibrator = TemperatureCalibrator(input="logit").fit(z, labels)
    alone = calibrator.predict_details(z)[0]
    far = np.array([[1e5, 0.0, -3.0, 2.0]])
    together = calibrator.predict_details(np.vstack([z[:100], far, z[100:]]))[0]
    np.testing.assert_array_equal(np.delete(together, 100, axis=0), alone)
    np.testing.assert_allclose(together[100], calibrator.predict_details(far)[0][0])
