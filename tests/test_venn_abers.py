"""VennAbersCalibrator against a brute-force refit per test score, its invariants, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import isotonic_regression
from sklearn.isotonic import IsotonicRegression

from calibd.inputs import CalibrationInputError
from calibd.calibration.venn_abers import VennAbersCalibrator


def isotonic_at(scores, labels, weights, s):
    """Isotonic regression with exact ties pooled (SciPy's PAV), read at score s."""
    distinct, group = np.unique(scores, return_inverse=True)
    total = np.bincount(group, weights=weights)
    positive = np.bincount(group, weights=weights * labels)
    fitted = isotonic_regression(positive / total, weights=total).x
    return fitted[np.searchsorted(distinct, s)]


def sklearn_isotonic_at(scores, labels, weights, s):
    """The same with scikit-learn, which pools ties too but also merges scores
    closer than 1e-15; at a fitted score its prediction is that block's value."""
    return IsotonicRegression().fit(scores, labels, sample_weight=weights).predict([s])[0]


def brute_force(scores, labels, weights, tests, isotonic_at=isotonic_at):
    """p0, p1 by definition: refit isotonic regression with (s, 0) and (s, 1) appended."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=float)
    weights = np.ones(len(scores)) if weights is None else np.asarray(weights, dtype=float)
    out = np.empty((len(tests), 2))
    for i, s in enumerate(tests):
        for label in (0, 1):
            out[i, label] = isotonic_at(np.r_[scores, s], np.r_[labels, label], np.r_[weights, 1.0], s)
    return out[:, 0], out[:, 1]


def check_against_brute_force(scores, labels, weights, tests, input="logit", reference=isotonic_at):
    model = VennAbersCalibrator(input=input).fit(scores, labels, sample_weight=weights)
    p, details = model.predict_details(tests)
    p0, p1 = brute_force(scores, labels, weights, tests, reference)
    np.testing.assert_allclose(details["intervals"][:, 0], p0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(details["intervals"][:, 1], p1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(p, p1 / (1 - p0 + p1), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(model.predict(tests), p)
    return model


@pytest.mark.parametrize("weighting", ["none", "integer", "fractional"])
@pytest.mark.parametrize("seed", range(40))
def test_many_ties_against_brute_force(seed, weighting):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 40))
    levels = int(rng.integers(2, 12))
    scores = rng.integers(0, levels, n).astype(float)
    labels = (rng.random(n) < rng.uniform(0.2, 0.8)).astype(int)
    labels[:4] = [0, 0, 1, 1]
    weights = {
        "none": None,
        "integer": rng.integers(1, 5, n).astype(float),
        "fractional": rng.uniform(0.02, 2.5, n),
    }[weighting]
    # Every holdout score, every gap between them, and both outsides.
    tests = np.r_[np.arange(-2, levels + 2), np.arange(-1, levels + 1) + 0.5]
    check_against_brute_force(scores, labels, weights, tests)
    check_against_brute_force(scores, labels, weights, tests, reference=sklearn_isotonic_at)


@pytest.mark.parametrize("seed", range(10))
def test_continuous_scores_against_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n = 300
    scores = rng.random(n)
    labels = (rng.random(n) < scores).astype(int)
    tests = np.r_[rng.choice(scores, 20), rng.random(20), 0.0, 1.0, scores.min(), scores.max()]
    check_against_brute_force(scores, labels, None, tests, input="probability", reference=sklearn_isotonic_at)


def test_hand_example():
    # Five 0s at 1.0 and five 1s at 2.0. A test score equal to 1.0 is pooled
    # with the five 0s: with label 1 that group's mean is 1/6. Strictly between
    # 1.0 and 2.0 the test point is a block of its own: p1 = 1.
    scores = [1.0, 2.0] * 5
    labels = [0, 1] * 5
    model = VennAbersCalibrator(input="logit").fit(scores, labels)
    _, details = model.predict_details([0.0, 1.0, 1.5, 2.0, 3.0])
    np.testing.assert_allclose(
        details["intervals"],
        [[0.0, 1 / 6], [0.0, 1 / 6], [0.0, 1.0], [5 / 6, 1.0], [5 / 6, 1.0]],
        rtol=0,
        atol=1e-15,
    )


def test_integer_weights_are_multiplicities():
    rng = np.random.default_rng(7)
    n = 60
    scores = np.round(rng.random(n), 1)
    labels = (rng.random(n) < scores).astype(int)
    labels[:4] = [0, 0, 1, 1]
    counts = rng.integers(1, 4, n)
    weighted = VennAbersCalibrator().fit(scores, labels, sample_weight=counts.astype(float))
    repeated = VennAbersCalibrator().fit(np.repeat(scores, counts), np.repeat(labels, counts))
    tests = np.linspace(0, 1, 41)
    np.testing.assert_allclose(
        weighted.predict_details(tests)[1]["intervals"],
        repeated.predict_details(tests)[1]["intervals"],
        rtol=0,
        atol=1e-12,
    )


def test_zero_weight_rows_are_ignored():
    rng = np.random.default_rng(3)
    scores = np.round(rng.random(40), 2)
    labels = (rng.random(40) < scores).astype(int)
    labels[:4] = [0, 0, 1, 1]
    weights = np.ones(40)
    weights[30:] = 0.0
    full = VennAbersCalibrator().fit(scores, labels, sample_weight=weights)
    part = VennAbersCalibrator().fit(scores[:30], labels[:30])
    tests = np.r_[scores, np.linspace(0, 1, 21)]
    np.testing.assert_array_equal(full.predict(tests), part.predict(tests))


def test_probability_and_logit_inputs_give_the_same_fit():
    rng = np.random.default_rng(5)
    p = np.round(rng.uniform(0.01, 0.99, 200), 2)
    labels = (rng.random(200) < p).astype(int)
    tests = np.round(rng.uniform(0.005, 0.995, 100), 3)
    logit = lambda q: np.log(q) - np.log1p(-q)  # noqa: E731
    on_p = VennAbersCalibrator(input="probability").fit(p, labels)
    on_z = VennAbersCalibrator(input="logit").fit(logit(p), labels)
    np.testing.assert_array_equal(on_p.predict(tests), on_z.predict(logit(tests)))


def test_fit_info():
    scores = np.arange(12) / 11
    labels = np.array([0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1])
    model = VennAbersCalibrator().fit(scores, labels)
    info = model.fit_info()
    json.dumps(info)
    assert info["n_distinct_scores"] == 12
    assert info["score_range"] == [0.0, 1.0]
    _, details = model.predict_details(np.r_[scores, scores[:-1] + 0.01])
    widths = details["intervals"][:, 1] - details["intervals"][:, 0]
    assert info["interval_width"]["min"] == pytest.approx(widths.min(), abs=1e-15)
    assert info["interval_width"]["max"] == pytest.approx(widths.max(), abs=1e-15)


# -- properties ---------------------------------------------------------------

holdouts = st.integers(10, 50).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(st.integers(0, 6).map(lambda k: k / 6), st.floats(0, 1)), min_size=n, max_size=n),
        st.lists(st.integers(0, 1), min_size=n, max_size=n),
        st.one_of(st.none(), st.lists(st.floats(0.05, 5), min_size=n, max_size=n)),
    )
)
queries = st.lists(st.one_of(st.integers(0, 6).map(lambda k: k / 6), st.floats(0, 1)), min_size=1, max_size=30)


def fit_from(holdout):
    scores, labels, weights = holdout
    labels = [0, 0, 1, 1] + labels[4:]  # both classes, at least two of each
    return VennAbersCalibrator().fit(scores, labels, sample_weight=weights)


@settings(max_examples=200, deadline=None)
@given(holdouts, queries)
def test_intervals_ordered_in_unit_interval_and_monotone(holdout, query):
    model = fit_from(holdout)
    query = np.sort(np.concatenate([query, holdout[0]]))
    p, details = model.predict_details(query)
    p0, p1 = details["intervals"].T
    assert details["intervals"].shape == (len(query), 2)
    assert np.all((0 <= p0) & (p0 <= p1) & (p1 <= 1))
    assert np.all((p0 <= p) & (p <= p1))
    # Non-decreasing in the score, exactly (monotone = True).
    assert np.all(np.diff(p0) >= 0) and np.all(np.diff(p1) >= 0) and np.all(np.diff(p) >= 0)


@settings(max_examples=50, deadline=None)
@given(holdouts, queries)
def test_against_brute_force_property(holdout, query):
    scores, labels, weights = holdout
    labels = [0, 0, 1, 1] + labels[4:]
    check_against_brute_force(np.array(scores), np.array(labels), weights, np.r_[query, scores[:5]], "probability")


@settings(max_examples=100, deadline=None)
@given(holdouts, queries)
def test_round_trip(holdout, query):
    model = fit_from(holdout)
    data = model.to_dict()
    assert data["method"] == "venn_abers"
    again = json.loads(json.dumps(data))
    for state in (data, again):
        rebuilt = VennAbersCalibrator._from_state(state["params"], state["state"])
        np.testing.assert_array_equal(rebuilt.predict(query), model.predict(query))
        np.testing.assert_array_equal(
            rebuilt.predict_details(query)[1]["intervals"], model.predict_details(query)[1]["intervals"]
        )
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
        (GOOD_SCORES, np.r_[GOOD_LABELS[:-1], 2], "labels"),
    ],
)
def test_bad_input(scores, labels, field):
    with pytest.raises(CalibrationInputError) as raised:
        VennAbersCalibrator().fit(scores, labels)
    assert raised.value.field == field


def test_bad_input_at_predict_and_weights():
    model = VennAbersCalibrator().fit(GOOD_SCORES, GOOD_LABELS)
    with pytest.raises(CalibrationInputError):
        model.predict_details([0.5, np.nan])
    with pytest.raises(CalibrationInputError):
        model.predict([1.2])
    with pytest.raises(CalibrationInputError):
        VennAbersCalibrator().fit(GOOD_SCORES, GOOD_LABELS, sample_weight=np.r_[np.ones(11), -1.0])
    with pytest.raises(CalibrationInputError):
        VennAbersCalibrator().fit(GOOD_SCORES, GOOD_LABELS, sample_weight=np.zeros(12))
