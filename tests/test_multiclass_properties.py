"""Properties of every multiclass method: rows that sum to 1, a faithful JSON round
trip, the column count checked at predict, and the service's fit path for K = 3."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibd.calibration import CalibrationInputError, fit_calibrator, from_dict, get_method

MULTICLASS = [
    ("temperature", {}),
    ("vector", {}),
    ("matrix", {}),
    ("dirichlet", {"variant": "full"}),
    ("dirichlet", {"variant": "diagonal", "regularization": "l2"}),
    ("dirichlet", {"variant": "fixed_diagonal"}),
    ("ovr_isotonic", {}),
    ("ovr_platt", {}),
    ("top_label_histogram", {"points_per_bin": 5}),
    ("lp_patch", {}),
]


def holdout(seed: int, n: int, k: int, spread: float, drop_last: bool, input: str):
    """Rows of K scores, some with probabilities that underflow to 0, and labels with
    every class present at least twice (or the last class absent)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, spread, (n, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    soft = np.exp(z / spread)
    soft /= soft.sum(axis=1, keepdims=True)
    labels = np.minimum((soft.cumsum(axis=1) < rng.uniform(size=(n, 1))).sum(axis=1), k - 1)
    labels[: 2 * k] = np.repeat(np.arange(k), 2)
    if drop_last:
        labels[labels == k - 1] = 0
    return (p if input == "probability" else z), labels


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(MULTICLASS),
    input=st.sampled_from(["probability", "logit"]),
    seed=st.integers(0, 2**31),
    k=st.sampled_from([3, 4, 7]),
    n=st.integers(40, 300),
    spread=st.sampled_from([0.5, 3.0, 40.0]),
    drop_last=st.booleans(),
)
def test_rows_sum_to_one_and_survive_a_json_round_trip(case, input, seed, k, n, spread, drop_last):
    method, options = case
    scores, labels = holdout(seed, n, k, spread, drop_last, input)
    calibrator = get_method(method).from_options(input, options).fit(scores, labels)
    # New rows, including near-one-hot rows (spread 40: probabilities of 1e-300 and exact zeros).
    query, _ = holdout(seed + 1, 50, k, spread * 2, False, input)
    out = calibrator.predict(query)
    assert out.shape == (50, k)
    assert np.all(np.isfinite(out)) and np.all(out >= 0) and np.all(out <= 1)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-9)
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    np.testing.assert_array_equal(rebuilt.predict(query), out)
    np.testing.assert_array_equal(calibrator.predict_proba(query), out)
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(query[:, :-1])
    assert error.value.field == "scores"
    with pytest.raises(CalibrationInputError):
        rebuilt.predict(np.column_stack([query, query[:, :1]]))


def test_two_dimensional_state_keeps_its_shape_through_json():
    scores, labels = holdout(0, 300, 4, 2.0, False, "logit")
    calibrator = get_method("matrix")(input="logit").fit(scores, labels)
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    assert rebuilt.weights_.shape == (4, 4) and rebuilt.n_classes_ == 4


def test_binary_temperature_rejects_rows_of_another_width():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 200)
    calibrator = get_method("temperature")(input="logit").fit(z, (z > 0).astype(int))
    assert calibrator.predict(np.column_stack([np.zeros(3), z[:3]])).shape == (3, 2)
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(np.zeros((3, 3)))
    assert error.value.field == "scores"


def test_probability_rows_must_sum_to_one():
    with pytest.raises(CalibrationInputError) as error:
        get_method("vector")().fit(np.full((30, 3), 0.3), [0, 1, 2] * 10)
    assert error.value.field == "scores" and error.value.index == (0,)


@pytest.mark.parametrize("method, options", MULTICLASS)
def test_fit_calibrator_end_to_end_for_three_classes(method, options):
    rng = np.random.default_rng(1)
    z = rng.normal(0, 2, (1500, 3))
    true = np.exp(z / 2.5 + np.array([0.4, 0.0, -0.4]))
    true /= true.sum(axis=1, keepdims=True)
    y = np.minimum((true.cumsum(axis=1) < rng.uniform(size=(1500, 1))).sum(axis=1), 2)
    names = np.array(["cat", "dog", "eel"])[y]
    for input, scores in (("logit", z), ("probability", np.exp(z) / np.exp(z).sum(axis=1, keepdims=True))):
        result = fit_calibrator(method, input, options, scores.tolist(), names.tolist())
        assert result.classes == ["cat", "dog", "eel"] and result.calibrator.n_classes_ == 3
        before, after = result.summary["before"], result.summary["after"]
        assert after["ece"] < before["ece"], (method, input, before, after)
        assert after["log_loss"] < before["log_loss"], (method, input, before, after)
        assert json.loads(json.dumps(result.summary)) == result.summary
        out = result.calibrator.predict(scores[:20])
        np.testing.assert_allclose(out.sum(axis=1), 1.0)
