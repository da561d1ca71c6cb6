"""The calibrator contract: validation, options, cross-fitting, auto, fit summaries."""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError, METHODS, NotFittedError, fit_calibrator, get_method
from calibd.calibration.crossfit import cross_val_predict, stratified_folds
from calibd.calibration.platt import PlattCalibrator


def test_validation_names_the_field_and_first_bad_element():
    with pytest.raises(CalibrationInputError) as error:
        PlattCalibrator().fit([0.1, np.nan, 0.2, np.inf], [0, 1, 0, 1])
    assert error.value.field == "scores" and error.value.index == (1,)
    with pytest.raises(CalibrationInputError) as error:
        PlattCalibrator().fit([0.1, 0.2, 1.2], [0, 1, 0])
    assert error.value.index == (2,)
    with pytest.raises(CalibrationInputError) as error:
        PlattCalibrator().fit([0.1] * 12, [0, 1] * 5 + [3, 1])
    assert error.value.field == "labels" and error.value.index == (10,)
    with pytest.raises(CalibrationInputError, match="both classes"):
        PlattCalibrator().fit([0.1] * 12, [1] * 12)
    with pytest.raises(CalibrationInputError, match="at least 10"):
        PlattCalibrator().fit([0.1, 0.9], [0, 1])


def test_logit_input_accepts_any_finite_real():
    z = np.linspace(-40, 40, 20)
    PlattCalibrator(input="logit").fit(z, [0, 1] * 10)
    with pytest.raises(CalibrationInputError):
        PlattCalibrator(input="probability").fit(z, [0, 1] * 10)


def test_options_are_checked_by_name_and_value():
    with pytest.raises(CalibrationInputError) as error:
        get_method("platt").from_options("probability", {"bins": 3})
    assert error.value.field == "options.bins" and "smooth_targets" in error.value.detail
    with pytest.raises(CalibrationInputError) as error:
        get_method("platt").from_options("probability", {"smooth_targets": 1})
    assert error.value.field == "options.smooth_targets"
    with pytest.raises(CalibrationInputError) as error:
        get_method("nope")
    assert error.value.field == "method"


def test_predict_before_fit():
    with pytest.raises(NotFittedError):
        PlattCalibrator().predict([0.5])


def test_get_params_and_predict_proba_follow_scikit_learn():
    calibrator = PlattCalibrator(smooth_targets=True)
    assert calibrator.get_params() == {"input": "probability", "smooth_targets": True}
    calibrator.set_params(smooth_targets=False)
    assert calibrator.smooth_targets is False
    rng = np.random.default_rng(0)
    proba = calibrator.fit(rng.uniform(size=50), [0, 1] * 25).predict_proba([0.2, 0.8])
    assert proba.shape == (2, 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_stratified_folds_spread_each_class_evenly():
    labels = np.array([0] * 23 + [1] * 7)
    folds = stratified_folds(labels, 5, seed=0)
    for label in (0, 1):
        counts = np.bincount(folds[labels == label], minlength=5)
        assert counts.max() - counts.min() <= 1
    sizes = np.bincount(folds, minlength=5)
    assert sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(folds, stratified_folds(labels, 5, seed=0))


def test_cross_val_predict_never_scores_a_row_with_a_model_that_saw_it():
    # A calibrator that memorises: the label of an exactly matching training score.
    class Memoriser(PlattCalibrator):
        method = "memoriser"

        def _fit(self, scores, labels, weights):
            self.table_ = dict(zip(scores.tolist(), labels.tolist()))

        def _predict(self, scores):
            return np.array([self.table_.get(s, 0.5) for s in scores.tolist()])

    rng = np.random.default_rng(0)
    scores = rng.uniform(size=100)
    labels = rng.integers(0, 2, 100)
    out = cross_val_predict(Memoriser(), scores, labels.astype(np.int8), np.ones(100))
    assert np.all(out == 0.5)


def test_fit_summary_is_cross_fitted():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.99, 2000)
    y = (rng.uniform(size=2000) < p**2).astype(int)
    result = fit_calibrator("platt", "probability", {}, p, y)
    assert result.summary["after"]["ece"] < result.summary["before"]["ece"]
    oof = cross_val_predict(result.calibrator, p, y.astype(np.int8), np.ones(2000))
    from calibd.metrics import log_loss

    assert result.summary["after"]["log_loss"] == pytest.approx(log_loss(oof, y))
    in_sample = log_loss(result.calibrator.predict(p), y)
    assert result.summary["after"]["log_loss"] >= in_sample  # out-of-sample is never flattered


def test_auto_picks_the_candidate_with_lowest_cross_validated_log_loss():
    rng = np.random.default_rng(1)
    z = rng.normal(0, 2, 3000)
    y = (rng.uniform(size=3000) < 1 / (1 + np.exp(-(0.5 * z - 1.0)))).astype(int)
    result = fit_calibrator("auto", "logit", {"candidates": ["platt", "temperature"]}, z, y)
    info = result.summary["fit"]
    # The data has a bias term that temperature scaling cannot express.
    assert info["chosen"] == "platt"
    assert info["cv_log_loss"]["platt"] < info["cv_log_loss"]["temperature"]
    assert isinstance(result.calibrator.calibrator_, PlattCalibrator)


def test_every_registered_method_declares_its_name():
    for name, cls in METHODS.items():
        assert cls.method == name


def test_extra_arrays_are_declared_split_by_fold_and_passed_to_predict():
    from calibd.calibration.validation import ArraySpec

    class ByFeature(PlattCalibrator):
        """Predicts the training label rate of rows whose feature has the same sign."""

        method = "by_feature"
        fit_arrays = {"features": ArraySpec(ndim=2, rows=True), "offset": ArraySpec(ndim=1, rows=False, required=False)}
        predict_arrays = {"features": ArraySpec(ndim=2, rows=True)}
        fitted_attributes = ("rates_",)
        seen: list = []

        def _fit(self, scores, labels, weights, features, offset=None):
            ByFeature.seen.append((scores.shape[0], features.shape[0], None if offset is None else offset.shape[0]))
            positive = features[:, 0] > 0
            self.rates_ = np.array([labels[~positive].mean(), labels[positive].mean()])

        def _predict(self, scores, features):
            return self.rates_[(features[:, 0] > 0).astype(int)]

    rng = np.random.default_rng(0)
    features = rng.normal(size=(100, 3))
    labels = (features[:, 0] > 0).astype(int)
    scores = rng.uniform(size=100)
    calibrator = ByFeature().fit(scores, labels, features=features, offset=np.ones(7))
    assert ByFeature.seen[-1] == (100, 100, 7)
    np.testing.assert_array_equal(calibrator.predict(scores, features=features), labels)
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(scores)
    assert error.value.field == "features"
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(scores, features=features[:10])
    assert error.value.field == "features"
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(scores, features=features, colour=[1])
    assert error.value.field == "colour"

    ByFeature.seen.clear()
    out = cross_val_predict(ByFeature(), scores, labels.astype(np.int8), np.ones(100), arrays={"features": features, "offset": np.ones(7)})
    assert [s[0] for s in ByFeature.seen] == [s[1] for s in ByFeature.seen]  # features split with the rows
    assert all(s[2] == 7 for s in ByFeature.seen)  # the rest passed whole
    np.testing.assert_array_equal(out, labels)
