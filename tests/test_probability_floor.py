"""The step methods keep their outputs off 0 and 1, so that a test set's log loss is finite.

Log loss is computed here from its definition, -mean(y log p + (1 - y) log(1 - p)),
without clipping: an output of exactly 0 or 1 on a row of the other class makes it infinite.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError
from calibd.calibration.registry import METHODS


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(y == 1, np.log(p), np.log1p(-p))
    return float(-terms.mean())


def binary(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Miscalibrated scores of a well-specified logistic truth; wide, so that isotonic's end
    blocks see one class only."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.5, n)
    labels = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-z))).astype(int)
    return 1.0 / (1.0 + np.exp(-(1.6 * z + 0.3))), labels


HOLDOUT = binary(2000, 1)
TEST = binary(20000, 2)


@pytest.mark.parametrize("method,options", [("isotonic", {}), ("histogram", {"prior_strength": 0.0}), ("histogram", {})])
def test_binary_step_methods_give_a_finite_log_loss_near_platts(method, options):
    platt = log_loss(METHODS["platt"]().fit(*HOLDOUT).predict(TEST[0]), TEST[1])
    p = METHODS[method](**options).fit(*HOLDOUT).predict(TEST[0])
    m = 1.0 / (2.0 * (HOLDOUT[0].shape[0] + 1))
    assert p.min() >= m and p.max() <= 1.0 - m
    loss = log_loss(p, TEST[1])
    assert np.isfinite(loss) and loss < platt + 0.02, (loss, platt)


def test_without_the_floor_isotonic_reaches_0_and_1_and_the_log_loss_is_infinite():
    raw = METHODS["isotonic"](min_probability=0).fit(*HOLDOUT)
    p = raw.predict(TEST[0])
    assert p.min() == 0.0 and p.max() == 1.0
    assert log_loss(p, TEST[1]) == np.inf
    # The default floor is exactly where the raw end blocks were.
    floored = METHODS["isotonic"]().fit(*HOLDOUT)
    m = 1.0 / (2.0 * (HOLDOUT[0].shape[0] + 1))
    assert floored.y_thresholds_[0] == m and floored.y_thresholds_[-1] == 1.0 - m
    np.testing.assert_array_equal(floored.x_thresholds_, raw.x_thresholds_)
    np.testing.assert_array_equal(floored.y_thresholds_, np.clip(raw.y_thresholds_, m, 1.0 - m))


def test_a_set_floor_is_used_as_given():
    p = METHODS["isotonic"](min_probability=0.01).fit(*HOLDOUT).predict(TEST[0])
    assert p.min() == 0.01 and p.max() == 0.99


def test_multiclass_step_methods_give_no_zero_probability():
    rng = np.random.default_rng(4)
    logits = rng.normal(0.0, 3.0, (3000, 3))
    truth = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = (rng.uniform(size=3000)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
    scores = np.exp(1.5 * logits) / np.exp(1.5 * logits).sum(axis=1, keepdims=True)
    train, test = slice(0, 1000), slice(1000, None)
    for method, options in (("ovr_isotonic", {}), ("top_label_histogram", {"prior_strength": 0.0})):
        p = METHODS[method](**options).fit(scores[train], labels[train]).predict(scores[test])
        assert (p > 0).all() and (p < 1).all(), method
        loss = -np.mean(np.log(p[np.arange(p.shape[0]), labels[test]]))
        assert np.isfinite(loss), method


@pytest.mark.parametrize("value", [0.5, -0.01, True, "0.1", float("nan")])
def test_min_probability_is_checked(value):
    for method in ("isotonic", "histogram", "top_label_histogram"):
        with pytest.raises(CalibrationInputError) as raised:
            METHODS[method].from_options("probability", {"min_probability": value})
        assert raised.value.field == "options.min_probability"


def test_the_option_reaches_the_service(client, name):
    scores, labels = HOLDOUT
    holdout = {"scores": scores[:200].round(6).tolist(), "labels": labels[:200].tolist()}
    bad = client.post("/calibrators", json={"name": name, "method": "isotonic", "options": {"min_probability": 0.7}, "holdout": holdout})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/options/min_probability", bad.text
    good = client.post("/calibrators", json={"name": name, "method": "isotonic", "options": {"min_probability": 0.05}, "holdout": holdout})
    assert good.status_code == 201, good.text
    p = client.post("/calibrate", json={"calibrator": name, "scores": [0.0, 1.0]}).json()["probabilities"]
    assert p == [0.05, 0.95]
