"""Multiclass temperature, vector, matrix and Dirichlet scaling against known truths."""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError, get_method
from calibd.calibration.linear import MAX_FULL_CLASSES, DirichletCalibrator, MatrixScalingCalibrator, VectorScalingCalibrator
from calibd.calibration.temperature import TemperatureCalibrator
from calibd.metrics import log_loss


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sample(p, rng):
    return np.minimum((p.cumsum(axis=1) < rng.uniform(size=(p.shape[0], 1))).sum(axis=1), p.shape[1] - 1)


@pytest.mark.parametrize("true_t", [2.5, 0.6])
def test_temperature_recovers_a_known_temperature_within_2_percent(true_t):
    rng = np.random.default_rng(0)
    z = rng.normal(0, 3, (20_000, 10))
    y = sample(softmax(z / true_t), rng)
    on_logits = TemperatureCalibrator(input="logit").fit(z, y)
    assert on_logits.temperature_ == pytest.approx(true_t, rel=0.02)
    # Probabilities are turned into log p, never rescaled directly: softmax(log p / T) = softmax(z / T).
    on_probabilities = TemperatureCalibrator(input="probability").fit(softmax(z), y)
    assert on_probabilities.temperature_ == pytest.approx(on_logits.temperature_, rel=1e-6)
    np.testing.assert_allclose(on_probabilities.predict(softmax(z[:50])), on_logits.predict(z[:50]), atol=1e-9)


def test_multiclass_temperature_is_the_maximum_likelihood_temperature():
    rng = np.random.default_rng(1)
    z = rng.normal(0, 2, (3000, 5))
    y = sample(softmax(z / 1.7), rng)
    w = rng.uniform(0.2, 3, 3000)
    fitted = TemperatureCalibrator(input="logit").fit(z, y, sample_weight=w).temperature_

    def loss(t):
        return log_loss(softmax(z / t), y, w)

    assert loss(fitted) <= min(loss(fitted * 1.001), loss(fitted / 1.001))


def test_two_column_rows_give_the_binary_temperature():
    rng = np.random.default_rng(2)
    z = rng.normal(0, 3, 4000)
    y = (rng.uniform(size=4000) < 1 / (1 + np.exp(-z / 2))).astype(int)
    binary = TemperatureCalibrator(input="logit").fit(z, y)
    rows = TemperatureCalibrator(input="logit").fit(np.column_stack([np.zeros_like(z), z]), y)
    assert rows.temperature_ == pytest.approx(binary.temperature_, rel=1e-7)


def test_temperature_stops_at_its_bounds():
    rng = np.random.default_rng(3)
    z = rng.normal(0, 3, (500, 4))
    # Labels always the top class: the best temperature is 0, the fit stops at the lower bound.
    assert TemperatureCalibrator(input="logit").fit(z, z.argmax(axis=1)).temperature_ == pytest.approx(1e-3)
    # Labels always the bottom class: no temperature helps; the upper bound, near-uniform output.
    high = TemperatureCalibrator(input="logit").fit(z, z.argmin(axis=1))
    assert high.temperature_ == pytest.approx(1e3)


def test_vector_scaling_recovers_known_biases():
    rng = np.random.default_rng(4)
    k = 5
    b_true = np.array([1.0, -0.5, 0.3, -1.0, 0.2])
    z = rng.normal(0, 1.5, (20_000, k))
    y = sample(softmax(z + b_true), rng)
    unpenalised = VectorScalingCalibrator(input="logit", reg_mu=0.0).fit(z, y)
    # softmax is unchanged by a common shift of the biases: compare them centred.
    np.testing.assert_allclose(unpenalised.bias_, b_true - b_true.mean(), atol=0.06)
    np.testing.assert_allclose(unpenalised.weights_, np.ones(k), atol=0.05)
    assert unpenalised.bias_.mean() == pytest.approx(0.0, abs=1e-12)  # stored centred
    default = VectorScalingCalibrator(input="logit").fit(z, y)
    np.testing.assert_allclose(default.bias_, b_true - b_true.mean(), atol=0.1)


def nondiagonal(n, rng, w_true, b_true, input):
    """Rows whose labels follow softmax(W x + b) with x the logits log p, non-diagonal W."""
    z = rng.normal(0, 2, (n, w_true.shape[0]))
    p = softmax(z)
    y = sample(softmax(np.log(p) @ w_true.T + b_true), rng)
    return (p if input == "probability" else z), y


@pytest.mark.parametrize("input", ["probability", "logit"])
def test_matrix_and_dirichlet_beat_temperature_and_vector_on_non_diagonal_miscalibration(input):
    rng = np.random.default_rng(5)
    w_true = np.array([[1.0, 0.8, 0.0, -0.4], [0.0, 0.7, 0.6, 0.0], [-0.5, 0.0, 1.2, 0.5], [0.6, -0.3, 0.0, 0.9]])
    b_true = np.array([0.3, -0.2, 0.0, 0.1])
    s_cal, y_cal = nondiagonal(5000, rng, w_true, b_true, input)
    s_test, y_test = nondiagonal(20_000, rng, w_true, b_true, input)
    raw = s_test if input == "probability" else softmax(s_test)
    held_out = {"none": log_loss(raw, y_test)}
    for name, calibrator in {
        "temperature": TemperatureCalibrator(input=input),
        "vector": VectorScalingCalibrator(input=input),
        "matrix": MatrixScalingCalibrator(input=input),
        "dirichlet": DirichletCalibrator(input=input),
    }.items():
        held_out[name] = log_loss(calibrator.fit(s_cal, y_cal).predict(s_test), y_test)
    for full in ("matrix", "dirichlet"):
        assert held_out[full] < held_out["none"]
        assert held_out[full] < held_out["temperature"] - 0.01, held_out
        assert held_out[full] < held_out["vector"] - 0.01, held_out


def test_dirichlet_variants_and_regularisers_fit_and_nest():
    rng = np.random.default_rng(6)
    z = rng.normal(0, 2, (3000, 4))
    y = sample(softmax(0.5 * z + np.array([0.5, 0, -0.5, 0])), rng)
    p = softmax(z)
    losses = {}
    for variant in ("fixed_diagonal", "diagonal", "full"):
        for regularization in ("odir", "l2"):
            model = DirichletCalibrator(variant=variant, regularization=regularization, reg_lambda=0.0, reg_mu=0.0)
            losses[variant, regularization] = log_loss(model.fit(p, y).predict(p), y)
            assert model.optimizer_["converged"], model.optimizer_
    # Without penalties the regulariser is irrelevant, and the variants nest.
    for variant in ("fixed_diagonal", "diagonal", "full"):
        assert losses[variant, "odir"] == pytest.approx(losses[variant, "l2"], abs=1e-7)
    assert losses["full", "odir"] <= losses["diagonal", "odir"] + 1e-7 <= losses["fixed_diagonal", "odir"] + 2e-7
    fixed = DirichletCalibrator(variant="fixed_diagonal").fit(p, y)
    assert fixed.weights_.shape == (1,) and fixed.bias_.shape == (4,)
    full = DirichletCalibrator().fit(p, y)
    assert full.weights_.shape == (4, 4)


def test_penalties_shrink_toward_the_identity_map():
    rng = np.random.default_rng(7)
    z = rng.normal(0, 2, (800, 4))
    y = sample(softmax(z), rng)
    loose = MatrixScalingCalibrator(input="logit", reg_lambda=0.0, reg_mu=0.0).fit(z, y)
    tight = MatrixScalingCalibrator(input="logit", reg_lambda=1e4, reg_mu=1e4).fit(z, y)
    off = ~np.eye(4, dtype=bool)
    assert np.abs(tight.weights_[off]).max() < 0.2 * np.abs(loose.weights_[off]).max()
    assert np.abs(tight.bias_).max() < 0.2 * np.abs(loose.bias_).max()


def test_a_class_absent_from_the_holdout_keeps_finite_parameters():
    rng = np.random.default_rng(8)
    z = rng.normal(0, 2, (2000, 4))
    y = sample(softmax(z), rng)
    y[y == 3] = 0
    for calibrator in (
        VectorScalingCalibrator(input="logit"),
        MatrixScalingCalibrator(input="logit"),
        DirichletCalibrator(input="logit", variant="diagonal"),
    ):
        out = calibrator.fit(z, y).predict(z)
        # The intercept penalty stops the absent class's bias before -infinity.
        assert np.all(np.isfinite(calibrator.bias_)) and calibrator.optimizer_["converged"]
        assert np.all(np.isfinite(out)) and np.allclose(out.sum(axis=1), 1.0)
        assert 0 < out[:, 3].mean() < 0.01, type(calibrator).__name__


def test_full_variants_refuse_more_than_the_class_limit():
    k = MAX_FULL_CLASSES + 1
    rng = np.random.default_rng(9)
    z = rng.normal(size=(2 * k, k))
    y = np.repeat(np.arange(k), 2)
    for method, options in [("matrix", {}), ("dirichlet", {"variant": "full"})]:
        with pytest.raises(CalibrationInputError) as error:
            get_method(method).from_options("logit", options).fit(z, y)
        assert error.value.field == "scores" and str(MAX_FULL_CLASSES) in error.value.detail


@pytest.mark.parametrize(
    "method, options, field",
    [
        ("dirichlet", {"variant": "triangular"}, "options.variant"),
        ("dirichlet", {"regularization": "l1"}, "options.regularization"),
        ("matrix", {"reg_lambda": -1}, "options.reg_lambda"),
        ("vector", {"reg_mu": float("nan")}, "options.reg_mu"),
        ("vector", {"max_iter": 0}, "options.max_iter"),
        ("vector", {"reg_lambda": 1.0}, "options.reg_lambda"),
    ],
)
def test_options_are_validated(method, options, field):
    with pytest.raises(CalibrationInputError) as error:
        get_method(method).from_options("logit", options)
    assert error.value.field == field


def test_fit_info_reports_the_optimiser():
    rng = np.random.default_rng(10)
    z = rng.normal(0, 2, (1000, 3))
    y = sample(softmax(z / 2), rng)
    info = VectorScalingCalibrator(input="logit").fit(z, y).fit_info()
    assert info["optimizer"]["converged"] and len(info["scales"]) == 3 and len(info["bias"]) == 3
