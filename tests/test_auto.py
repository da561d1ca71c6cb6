"""auto: the choice, twins fitted once, the summary reusing the choice's out-of-fold predictions, timings."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from calibd.calibration import fit_calibrator, from_dict, get_method
from calibd.calibration.auto import AutoCalibrator, cross_validate
from calibd.calibration.crossfit import CROSS_FIT_SEED, CROSS_FIT_SPLITS, cross_val_predict, stratified_folds
from calibd.metrics import log_loss


def overconfident(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits 2.5 z* + offset, labels drawn from softmax(z*)."""
    rng = np.random.default_rng(seed)
    true = rng.normal(0.0, 2.0, (n, k))
    p = np.exp(true - true.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = np.minimum((p.cumsum(axis=1) < rng.uniform(size=(n, 1))).sum(axis=1), k - 1)
    return 2.5 * true + rng.normal(0.0, 0.5, k), labels


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_matrix_and_dirichlet_are_one_model_on_probabilities_and_are_fitted_once():
    z, y = overconfident(1500, 6, seed=1)
    p = softmax(z)
    weights = np.ones(y.shape[0])
    folds = stratified_folds(y, 5, 0)
    # The claim the shortcut rests on, checked by fitting both.
    np.testing.assert_array_equal(
        cross_val_predict(get_method("matrix")(input="probability"), p, y, weights, folds=folds),
        cross_val_predict(get_method("dirichlet")(input="probability"), p, y, weights, folds=folds),
    )
    auto = AutoCalibrator(input="probability").fit(p, y)
    assert auto.same_model_as_ == {"dirichlet": "matrix"}
    assert auto.cv_log_loss_["dirichlet"] == auto.cv_log_loss_["matrix"]
    assert auto.chosen_ != "dirichlet"  # a tie keeps the first listed
    assert auto.fit_info()["same_model_as"] == {"dirichlet": "matrix"}


def test_on_logits_matrix_and_dirichlet_differ_and_both_are_fitted():
    z, y = overconfident(1500, 6, seed=2)
    weights = np.ones(y.shape[0])
    folds = stratified_folds(y, 5, 0)
    matrix = cross_val_predict(get_method("matrix")(input="logit"), z, y, weights, folds=folds)
    dirichlet = cross_val_predict(get_method("dirichlet")(input="logit"), z, y, weights, folds=folds)
    assert np.abs(matrix - dirichlet).max() > 1e-6
    auto = AutoCalibrator(input="logit", candidates=["matrix", "dirichlet"]).fit(z, y)
    assert auto.same_model_as_ == {}
    assert auto.cv_log_loss_["matrix"] == pytest.approx(log_loss(matrix, y))
    assert auto.cv_log_loss_["dirichlet"] == pytest.approx(log_loss(dirichlet, y))


def test_cross_validation_gives_the_same_predictions_on_one_thread_or_several():
    z, y = overconfident(1200, 5, seed=3)
    weights = np.ones(y.shape[0])
    folds = stratified_folds(y, 5, 0)
    candidates = [(name, get_method(name)(input="logit")) for name in ("temperature", "vector", "ovr_isotonic")]
    one = cross_validate(candidates, z, y, weights, folds, threads=1)
    several = cross_validate(candidates, z, y, weights, folds, threads=3)
    for name, _ in candidates:
        np.testing.assert_array_equal(one[name][0], several[name][0])
        # and each is the plain cross-fit of that method
        np.testing.assert_array_equal(one[name][0], cross_val_predict(get_method(name)(input="logit"), z, y, weights, folds=folds))


def test_summary_reuses_the_chosen_methods_out_of_fold_predictions():
    z, y = overconfident(2000, 8, seed=4)
    result = fit_calibrator("auto", "logit", None, z, y)
    chosen = result.summary["fit"]["chosen"]
    assert result.summary["cross_fit"]["of"].startswith("the chosen method")
    # Independent check: cross-fit the chosen method alone on the summary's folds.
    folds = stratified_folds(y, CROSS_FIT_SPLITS, CROSS_FIT_SEED)
    oof = cross_val_predict(get_method(chosen)(input="logit"), z, y, np.ones(y.shape[0]), folds=folds)
    assert result.summary["after"]["log_loss"] == pytest.approx(log_loss(oof, y), rel=1e-12)
    assert result.summary["after"]["log_loss"] == pytest.approx(result.summary["fit"]["cv_log_loss"][chosen], rel=1e-12)
    # The calibrator served is the chosen method refitted on every row.
    alone = get_method(chosen)(input="logit").fit(z, y)
    np.testing.assert_allclose(result.calibrator.predict(z[:50]), alone.predict(z[:50]), rtol=0, atol=1e-12)
    rebuilt = from_dict(json.loads(json.dumps(result.calibrator.to_dict())))
    np.testing.assert_array_equal(rebuilt.predict(z[:50]), result.calibrator.predict(z[:50]))


def test_other_folds_cross_fit_the_whole_choice():
    z, y = overconfident(600, 4, seed=5)
    options = {"candidates": ["temperature", "vector"], "n_splits": 3}
    result = fit_calibrator("auto", "logit", options, z, y)
    assert result.summary["cross_fit"]["of"] == "the whole fit"
    folds = stratified_folds(y, CROSS_FIT_SPLITS, CROSS_FIT_SEED)
    nested = cross_val_predict(get_method("auto").from_options("logit", options), z, y, np.ones(y.shape[0]), folds=folds)
    assert result.summary["after"]["log_loss"] == pytest.approx(log_loss(nested, y), rel=1e-12)


def test_fit_seconds_is_the_whole_time_and_names_its_parts():
    z, y = overconfident(800, 4, seed=6)
    result = fit_calibrator("auto", "logit", {"candidates": ["temperature", "vector"]}, z, y)
    timings = result.summary["timings"]
    assert set(timings) == {"validate", "fit", "cross_fit", "summary"}
    assert all(value > 0 for value in timings.values())
    assert sum(timings.values()) == pytest.approx(result.fit_seconds, rel=1e-9)


def test_calibration_modules_import_one_way():
    """The registry imports the methods; no method module imports the registry or the fitting module."""
    package = Path(__file__).resolve().parents[1] / "app" / "calibration"
    for path in package.glob("*.py"):
        if path.name in ("__init__.py", "registry.py", "fitting.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module not in ("registry", "fitting"), (path.name, node.module)
