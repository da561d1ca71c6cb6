"""IsotonicCalibrator against scikit-learn, its invariants, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression

from calibd.inputs import CalibrationInputError
from calibd.calibration.isotonic import IsotonicCalibrator


def make_data(rng, n, input, ties):
    if input == "probability":
        scores = rng.beta(2, 3, n)
        new = np.concatenate([rng.random(500), [0.0, 1.0]])
    else:
        scores = rng.normal(0, 2, n)
        new = np.concatenate([rng.normal(0, 3, 500), [-50.0, 50.0]])
    if ties:
        scores = np.round(scores, 1)
        new = np.concatenate([new, scores[:50]])  # exactly on holdout scores
    p = scores if input == "probability" else 1 / (1 + np.exp(-scores))
    labels = (rng.random(n) < p**1.5).astype(int)
    return scores, labels, new


def sklearn_predict(scores, labels, weights, new):
    reference = IsotonicRegression(out_of_bounds="clip").fit(scores, labels, sample_weight=weights)
    return reference, reference.predict(new)


@pytest.mark.parametrize("input", ["probability", "logit"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_matches_sklearn(input, ties, weighted, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 2000))
    scores, labels, new = make_data(rng, n, input, ties)
    weights = None
    if weighted:
        weights = rng.uniform(0.1, 3.0, n)
        weights[rng.random(n) < 0.1] = 0.0  # zero-weight rows are dropped by both
    ours = IsotonicCalibrator(min_probability=0, input=input).fit(scores, labels, sample_weight=weights)
    reference, expected = sklearn_predict(scores, labels, weights, new)
    np.testing.assert_allclose(ours.predict(new), expected, rtol=0, atol=1e-12)
    # The same trimmed block boundaries are stored.
    np.testing.assert_array_equal(ours.x_thresholds_, reference.X_thresholds_)
    np.testing.assert_allclose(ours.y_thresholds_, reference.y_thresholds_, rtol=0, atol=1e-12)
    # By default the block values are kept within [m, 1 - m], m = 1 / (2 (n + 1)) for n rows of
    # positive weight, and interpolated as before.
    m = 0.5 / (np.count_nonzero(weights > 0) + 1) if weighted else 0.5 / (n + 1)
    floored = IsotonicCalibrator(input=input).fit(scores, labels, sample_weight=weights)
    kept = np.interp(new, reference.X_thresholds_, np.clip(reference.y_thresholds_, m, 1 - m))
    np.testing.assert_allclose(floored.predict(new), kept, rtol=0, atol=1e-12)


def test_constant_fit_and_single_distinct_score():
    labels = np.array([0, 1] * 10)
    same = IsotonicCalibrator(min_probability=0).fit(np.full(20, 0.3), labels)
    np.testing.assert_array_equal(same.predict([0.0, 0.3, 1.0]), [0.5, 0.5, 0.5])
    assert same.fit_info()["n_blocks"] == 1
    # Labels decreasing in the score: one pooled block.
    scores = np.linspace(0, 1, 20)
    flat = IsotonicCalibrator(min_probability=0).fit(scores, (scores < 0.5).astype(int))
    np.testing.assert_allclose(flat.predict(scores), 0.5)
    assert flat.x_thresholds_.tolist() == [0.0, 1.0]


def test_fit_info():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    labels = np.array([0, 0, 1, 0, 0, 1, 1, 0, 1, 1])
    info = IsotonicCalibrator(min_probability=0).fit(scores, labels).fit_info()
    expected = IsotonicRegression().fit(scores, labels).predict(scores)
    assert info["n_blocks"] == len(np.unique(expected))
    assert info["score_range"] == [0.1, 0.95]
    assert info["output_range"] == [0.0, 1.0]
    json.dumps(info)


# -- properties ---------------------------------------------------------------

holdouts = st.integers(10, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(st.integers(0, 8).map(lambda k: k / 8), st.floats(0, 1)), min_size=n, max_size=n),
        st.lists(st.integers(0, 1), min_size=n, max_size=n),
        st.one_of(st.none(), st.lists(st.floats(0.01, 10), min_size=n, max_size=n)),
    )
)
queries = st.lists(st.floats(0, 1), min_size=1, max_size=30)


def fit_from(holdout, input="probability"):
    scores, labels, weights = holdout
    labels = [0, 0, 1, 1] + labels[4:]  # both classes, at least two of each
    return IsotonicCalibrator(min_probability=0, input=input).fit(scores, labels, sample_weight=weights)


@settings(max_examples=200, deadline=None)
@given(holdouts, queries)
def test_output_in_unit_interval_and_monotone(holdout, query):
    model = fit_from(holdout)
    query = np.sort(np.concatenate([query, holdout[0]]))
    p = model.predict(query)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(np.diff(p) >= 0)
    np.testing.assert_array_equal(model.predict_proba(query)[:, 1], p)


@settings(max_examples=100, deadline=None)
@given(holdouts, queries)
def test_round_trip(holdout, query):
    model = fit_from(holdout)
    data = model.to_dict()
    text = json.dumps(data)
    assert data["method"] == "isotonic"
    rebuilt = IsotonicCalibrator._from_state(data["params"], data["state"])
    np.testing.assert_array_equal(rebuilt.predict(query), model.predict(query))
    again = json.loads(text)
    rebuilt = IsotonicCalibrator._from_state(again["params"], again["state"])
    np.testing.assert_array_equal(rebuilt.predict(query), model.predict(query))
    assert rebuilt.fit_info() == model.fit_info()


# -- bad input ----------------------------------------------------------------

GOOD_SCORES = np.linspace(0.05, 0.95, 12)
GOOD_LABELS = np.array([0, 1] * 6)


@pytest.mark.parametrize(
    "scores, labels, field",
    [
        (np.r_[GOOD_SCORES[:-1], np.nan], GOOD_LABELS, "scores"),
        (np.r_[GOOD_SCORES[:-1], 1.5], GOOD_LABELS, "scores"),
        (np.r_[GOOD_SCORES[:-1], -0.1], GOOD_LABELS, "scores"),
        (GOOD_SCORES, np.zeros(12, dtype=int), "labels"),
        (GOOD_SCORES, np.ones(12, dtype=int), "labels"),
        (GOOD_SCORES, np.r_[GOOD_LABELS[:-1], np.nan], "labels"),
    ],
)
def test_bad_input(scores, labels, field):
    with pytest.raises(CalibrationInputError) as raised:
        IsotonicCalibrator(min_probability=0).fit(scores, labels)
    assert raised.value.field == field


def test_bad_input_at_predict_and_weights():
    model = IsotonicCalibrator(min_probability=0).fit(GOOD_SCORES, GOOD_LABELS)
    with pytest.raises(CalibrationInputError):
        model.predict([0.5, np.nan])
    with pytest.raises(CalibrationInputError):
        IsotonicCalibrator(min_probability=0).fit(GOOD_SCORES, GOOD_LABELS, sample_weight=np.r_[np.ones(11), -1.0])
    # Only one class keeps a positive weight.
    with pytest.raises(CalibrationInputError):
        IsotonicCalibrator(min_probability=0).fit(GOOD_SCORES, GOOD_LABELS, sample_weight=GOOD_LABELS.astype(float))
    # Logit input accepts any finite score, but not infinity.
    IsotonicCalibrator(min_probability=0, input="logit").fit(GOOD_SCORES * 40 - 20, GOOD_LABELS)
    with pytest.raises(CalibrationInputError):
        IsotonicCalibrator(min_probability=0, input="logit").fit(np.r_[GOOD_SCORES[:-1], np.inf], GOOD_LABELS)


def test_subnormal_knot_spacing_stays_finite():
    # np.interp's slope (y1 - y0) / (x1 - x0) overflows for knots 1e-311 apart.
    scores = np.r_[np.zeros(14), 2.0e-311, 2.0e-311]
    labels = np.r_[np.zeros(12), 1, 1, 1, 1]
    model = IsotonicCalibrator(min_probability=0).fit(scores, labels)
    p = model.predict([0.0, 5e-324, 1e-311, 2.0e-311, 0.5])
    assert np.all(np.isfinite(p)) and np.all(np.diff(p) >= 0)
    np.testing.assert_allclose(p, [1 / 7, 1 / 7, 1 / 7 + 0.5 * 6 / 7, 1.0, 1.0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("input", ["probability", "logit"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("weights", ["unit", "varied", "some zero"])
def test_cross_val_predictions_are_a_refit_per_fold(input, ties, weights):
    """The one-sort cross-fit gives the very floats of a fresh calibrator fitted on each fold's training rows."""
    from calibd.calibration.crossfit import stratified_folds

    rng = np.random.default_rng(7)
    scores, labels, _ = make_data(rng, 3000, input, ties)
    scores[:40] = -0.0 if input == "probability" else scores[:40]
    w = {"unit": np.ones(3000), "varied": rng.uniform(0.1, 3.0, 3000),
         "some zero": rng.choice([0.0, 0.5, 1.0, 2.5], 3000)}[weights]
    folds = stratified_folds(labels, 5, 0)
    calibrator = IsotonicCalibrator(input=input)
    fast = calibrator.cross_val_predictions(scores, labels, w, folds, 5)
    for fold in range(5):
        test = folds == fold
        refit = IsotonicCalibrator(input=input)
        refit._fit(scores[~test], labels[~test], w[~test])
        assert np.array_equal(fast[test], refit._predict(scores[test]))


def test_large_holdout_summary_evaluates_a_subsample_and_says_so():
    """Over SUMMARY_EVALUATE_ROWS rows the full evaluation is of a seeded subsample; the headline metrics of every row."""
    from calibd.calibration import fitting
    from calibd.metrics import ece

    rng = np.random.default_rng(3)
    n = fitting.SUMMARY_EVALUATE_ROWS + 5000
    scores = rng.uniform(size=n)
    labels = (rng.uniform(size=n) < scores**2).astype(int)
    result = fitting.fit_calibrator("isotonic", "probability", None, scores, labels)
    holdout = result.summary["holdout"]
    assert holdout["rows_used"] == fitting.SUMMARY_EVALUATE_ROWS
    assert holdout["subsample"]["rows"] == n
    assert sum(b["count"] for b in holdout["before"]["reliability"]["bins"]) == fitting.SUMMARY_EVALUATE_ROWS
    assert result.summary["before"]["ece"] == pytest.approx(ece(scores, labels), abs=1e-12)
    again = fitting.fit_calibrator("isotonic", "probability", None, scores, labels)
    assert again.summary["holdout"] == holdout  # the same rows every time
    small = fitting.fit_calibrator("isotonic", "probability", None, scores[:2000], labels[:2000]).summary["holdout"]
    assert small["rows_used"] == 2000 and small["subsample"] is None


@pytest.mark.parametrize("scale", ["probability", "small logits"])
@pytest.mark.parametrize("ties", [False, True])
def test_the_key_sort_fit_and_cross_fit_match_sklearn_and_the_general_path(scale, ties, monkeypatch):
    """Unit weights, 0/1 labels and |score| < 2 take the int64-key path (one sort of keys holding
    the score's bits and the label): the same thresholds as scikit-learn's IsotonicRegression and as
    the general path (forced by weights of 2), and out-of-fold predictions equal to a plain refit per fold, on one thread or several."""
    from calibd.calibration import auto, isotonic
    from calibd.calibration.crossfit import stratified_folds

    rng = np.random.default_rng(3)
    n = 40_000
    scores = rng.uniform(0, 1, n) if scale == "probability" else rng.uniform(-1.99, 1.99, n)
    if ties:
        scores = np.round(scores, 2)
    scores[:25] = -0.0 if scale == "small logits" else 0.0  # -0.0 ties with 0.0
    scores[25:50] = 0.0
    p = scores if scale == "probability" else 1 / (1 + np.exp(-2 * scores))
    labels = (rng.random(n) < p**2).astype(np.int8)
    input = "probability" if scale == "probability" else "logit"
    assert isotonic._unit_keys(scores, labels) is not None
    ours = IsotonicCalibrator(input=input, min_probability=0)
    ours._fit(scores, labels, np.ones(n))
    reference = IsotonicRegression(out_of_bounds="clip").fit(scores, labels)
    np.testing.assert_array_equal(ours.x_thresholds_, reference.X_thresholds_ + 0.0)
    np.testing.assert_allclose(ours.y_thresholds_, reference.y_thresholds_, rtol=0, atol=1e-12)
    # The general path (argsort, pooled sums), forced by weights of 2: the same floats (2k / 2n = k / n).
    general = IsotonicCalibrator(input=input, min_probability=0)
    general._fit(scores, labels, np.full(n, 2.0))
    np.testing.assert_array_equal(ours.x_thresholds_, general.x_thresholds_)
    np.testing.assert_array_equal(ours.y_thresholds_, general.y_thresholds_)
    folds = stratified_folds(labels, 5, 0)
    calibrator = IsotonicCalibrator(input=input)
    threaded = calibrator.cross_val_predictions(scores, labels, np.ones(n), folds, 5)
    monkeypatch.setattr(auto, "available_threads", lambda: 1)
    one_thread = calibrator.cross_val_predictions(scores, labels, np.ones(n), folds, 5)
    assert np.array_equal(threaded, one_thread)
    for fold in range(5):
        test = folds == fold
        refit = IsotonicCalibrator(input=input)
        refit._fit(scores[~test], labels[~test], 2.0 * np.ones(np.count_nonzero(~test)))
        assert np.array_equal(threaded[test], refit._predict(scores[test]))


@pytest.mark.parametrize("seed", range(20))
def test_pav_kernel_and_trimming_match_scipy_isotonic_regression(seed):
    """``_thresholds`` calls SciPy's PAV kernel directly and trims from its blocks; the result is
    the trimming of ``scipy.optimize.isotonic_regression``'s full fit, float for float."""
    from scipy.optimize import isotonic_regression

    from calibd.calibration.isotonic import _thresholds

    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 3000))
    x = np.sort(rng.choice(10 * k + 10, k, replace=False)).astype(np.float64)
    total = rng.integers(1, 4, k).astype(np.float64)
    positive = np.minimum(total, rng.integers(0, 4, k)).astype(np.float64)
    if seed % 3 == 0:  # long flat runs
        positive = np.where(rng.random(k) < 0.5, 0.0, total)
    fitted = isotonic_regression(positive / total, weights=total).x
    keep = np.ones(k, dtype=bool)
    keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
    x_thresholds, y_thresholds = _thresholds(x, total.copy(), positive.copy())
    np.testing.assert_array_equal(x_thresholds, x[keep])
    np.testing.assert_array_equal(y_thresholds, np.clip(fitted[keep], 0.0, 1.0))
