"""Histogram binning: hand-computed cases, ties, the bin convention, properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibd.inputs import CalibrationInputError
from calibd.calibration.histogram import HistogramCalibrator, equal_mass_edges

TEN = np.array([0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95])
TEN_LABELS = np.array([0, 0, 0, 1, 0, 0, 1, 0, 1, 1])  # base rate 0.4


def test_five_equal_bins_without_prior():
    calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=0).fit(TEN, TEN_LABELS)
    np.testing.assert_array_equal(calibrator.edges_, [0.25, 0.45, 0.65, 0.85])
    np.testing.assert_array_equal(calibrator.values_, [0.0, 0.5, 0.0, 0.5, 1.0])
    np.testing.assert_array_equal(calibrator.bin_weights_, [2, 2, 2, 2, 2])
    np.testing.assert_array_equal(calibrator.predict(TEN), [0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5, 1, 1])


def test_prior_shrinks_toward_the_base_rate():
    # (sum y + S r) / (n_bin + S) with S = 2, r = 0.4.
    calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=2.0).fit(TEN, TEN_LABELS)
    assert calibrator.base_rate_ == pytest.approx(0.4)
    np.testing.assert_allclose(calibrator.values_, [0.8 / 4, 1.8 / 4, 0.8 / 4, 1.8 / 4, 2.8 / 4], rtol=1e-15)
    # The default is S = 2.
    np.testing.assert_array_equal(HistogramCalibrator(min_probability=0, n_bins=5).fit(TEN, TEN_LABELS).values_, calibrator.values_)


def test_uneven_split_and_the_bin_convention():
    # n = 10, 3 bins: edges at the distinct scores with 3.33 and 6.67 points
    # before them, rounded: positions 3 and 7, bins of 3, 4, 3.
    calibrator = HistogramCalibrator(min_probability=0, n_bins=3, prior_strength=0).fit(TEN, TEN_LABELS)
    np.testing.assert_array_equal(calibrator.edges_, [0.35, 0.75])
    np.testing.assert_array_equal(calibrator.bin_weights_, [3, 4, 3])
    np.testing.assert_allclose(calibrator.values_, [0.0, 0.5, 2 / 3], rtol=1e-15)
    # Left-closed bins: an edge belongs to the bin above it; the ends take
    # everything beyond the holdout range.
    queries = [0.0, 0.05, 0.3499, 0.35, 0.7499, 0.75, 0.95, 1.0]
    np.testing.assert_allclose(calibrator.predict(queries), [0, 0, 0, 0.5, 0.5, 2 / 3, 2 / 3, 2 / 3], rtol=1e-15)


def test_ties_are_never_split_and_empty_bins_merge():
    scores = np.array([0.2, 0.5, 0.2, 0.9, 0.2, 0.2, 0.5, 0.2, 0.9, 0.2])
    labels = np.array([1, 1, 0, 1, 0, 0, 0, 0, 1, 1])
    # Five bins asked; distinct scores 0.2 (x6), 0.5 (x2), 0.9 (x2) allow three.
    calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=0).fit(scores, labels)
    np.testing.assert_array_equal(calibrator.edges_, [0.5, 0.9])
    np.testing.assert_array_equal(calibrator.bin_weights_, [6, 2, 2])
    np.testing.assert_allclose(calibrator.values_, [2 / 6, 0.5, 1.0], rtol=1e-15)
    with_prior = HistogramCalibrator(min_probability=0, n_bins=5).fit(scores, labels)  # r = 0.5
    np.testing.assert_allclose(with_prior.values_, [3 / 8, 2 / 4, 3 / 4], rtol=1e-15)
    # More bins than distinct scores: one bin per distinct score.
    many = HistogramCalibrator(min_probability=0, n_bins=1000, prior_strength=0).fit(scores, labels)
    np.testing.assert_array_equal(many.edges_, [0.5, 0.9])
    np.testing.assert_array_equal(many.values_, calibrator.values_)


def test_ties_at_the_minimum_and_straddling_an_edge():
    scores = np.array([0.1] * 8 + [0.3, 0.7])
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 0, 1])
    calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=0).fit(scores, labels)
    np.testing.assert_array_equal(calibrator.edges_, [0.3])
    np.testing.assert_allclose(calibrator.values_, [0.25, 0.5], rtol=1e-15)
    # Target 4 of 8 points falls inside the run of 3s: 2 points before the
    # 3s, 6 before the 4, equally near; halfway goes to the upper edge.
    edges = equal_mass_edges(np.array([1.0, 2, 3, 3, 3, 3, 4, 5]), np.ones(8), 2)
    np.testing.assert_array_equal(edges, [4.0])
    edges = equal_mass_edges(np.array([1.0, 2, 3, 3, 3, 4, 5, 6]), np.ones(8), 2)
    np.testing.assert_array_equal(edges, [4.0])  # 5 before the 4 is nearer than 2 before the 3s
    edges = equal_mass_edges(np.array([1.0, 2, 3, 3, 3, 3, 3, 4]), np.ones(8), 2)
    np.testing.assert_array_equal(edges, [3.0])  # 2 before the 3s is nearer than 7 before the 4


def test_sample_weights_on_logit_scores():
    scores = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, -2.0, 7.0, 8.0])
    labels = np.array([1, 0, 0, 1, 1, 0, 0, 1, 1, 0])
    weights = np.array([3.0, 1, 1, 1, 1, 1, 0, 0, 0, 0])  # the last four count for nothing
    calibrator = HistogramCalibrator(min_probability=0, input="logit", n_bins=2, prior_strength=0).fit(scores, labels, weights)
    # W = 8; the edge is the score with weight 4 before it: 3.0.
    np.testing.assert_array_equal(calibrator.edges_, [3.0])
    np.testing.assert_allclose(calibrator.values_, [3 / 4, 2 / 4], rtol=1e-15)
    np.testing.assert_allclose(calibrator.predict([-5.0, 2.9, 3.0, 100.0]), [0.75, 0.75, 0.5, 0.5])
    shrunk = HistogramCalibrator(min_probability=0, input="logit", n_bins=2, prior_strength=2).fit(scores, labels, weights)
    assert shrunk.base_rate_ == pytest.approx(5 / 8)
    np.testing.assert_allclose(shrunk.values_, [(3 + 1.25) / 6, (2 + 1.25) / 6], rtol=1e-15)


def test_single_bin_and_zero_weight_bins():
    one = HistogramCalibrator(min_probability=0, n_bins=1).fit(TEN, TEN_LABELS)
    assert one.edges_.shape == (0,)
    np.testing.assert_allclose(one.predict([0.0, 0.5, 1.0]), 0.4)
    # A bin whose points all have weight 0 gets the base rate.
    weights = np.array([0.0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    for strength in (0.0, 2.0):
        calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=strength).fit(TEN, TEN_LABELS, weights)
        assert np.isfinite(calibrator.values_).all()
        assert calibrator.predict([0.05])[0] == pytest.approx(calibrator.base_rate_)


def test_not_monotone_and_info():
    assert HistogramCalibrator.monotone is False
    calibrator = HistogramCalibrator(min_probability=0, n_bins=5, prior_strength=0).fit(TEN, TEN_LABELS)
    info = calibrator.fit_info()
    assert info["n_bins"] == 5 and info["edges"] == [0.25, 0.45, 0.65, 0.85] and info["base_rate"] == pytest.approx(0.4)
    json.dumps(info)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"n_bins": 0}, "options.n_bins"),
        ({"n_bins": 1001}, "options.n_bins"),
        ({"n_bins": 2.5}, "options.n_bins"),
        ({"n_bins": True}, "options.n_bins"),
        ({"n_bins": "10"}, "options.n_bins"),
        ({"prior_strength": -1}, "options.prior_strength"),
        ({"prior_strength": float("nan")}, "options.prior_strength"),
        ({"prior_strength": float("inf")}, "options.prior_strength"),
        ({"prior_strength": "2"}, "options.prior_strength"),
        ({"bins": 10}, "options.bins"),
    ],
)
def test_bad_options(options, field):
    with pytest.raises(CalibrationInputError) as excinfo:
        HistogramCalibrator.from_options("probability", options)
    assert excinfo.value.field == field


def test_good_options():
    calibrator = HistogramCalibrator.from_options("logit", {"n_bins": 1000, "prior_strength": 0})
    assert calibrator.n_bins == 1000 and calibrator.input == "logit"
    HistogramCalibrator.from_options("probability", {"n_bins": np.int64(3), "prior_strength": 1})


# -- properties -------------------------------------------------------------------------


@st.composite
def holdouts(draw):
    n = draw(st.integers(10, 80))
    # Few distinct values now and then, to exercise ties.
    values = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) if draw(st.booleans()) else st.floats(0.0, 1.0)
    scores = draw(st.lists(values, min_size=n, max_size=n))
    labels = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    labels[:4] = [0, 0, 1, 1]
    weights = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    return np.array(scores), np.array(labels), np.array(weights)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holdouts(), st.integers(1, 30), st.sampled_from([0.0, 0.5, 2.0, 10.0]), st.lists(st.floats(0.0, 1.0), max_size=20))
def test_properties(holdout, n_bins, prior_strength, queries):
    scores, labels, weights = holdout
    calibrator = HistogramCalibrator(min_probability=0, n_bins=n_bins, prior_strength=prior_strength).fit(scores, labels, weights)
    queries = np.concatenate([queries, scores, [0.0, 1.0]])
    out = calibrator.predict(queries)
    assert ((out >= 0) & (out <= 1)).all()
    n_fitted = calibrator.values_.shape[0]
    assert 1 <= n_fitted <= min(n_bins, np.unique(scores).shape[0])
    assert (calibrator.bin_weights_ > 0).all()  # no empty bin
    assert (np.diff(calibrator.edges_) > 0).all()
    # A weight of k is k copies of the row.
    copies = HistogramCalibrator(min_probability=0, n_bins=n_bins, prior_strength=prior_strength).fit(
        np.repeat(scores, weights), np.repeat(labels, weights)
    )
    np.testing.assert_array_equal(copies.edges_, calibrator.edges_)
    np.testing.assert_allclose(copies.predict(queries), out, rtol=1e-12)
    data = json.loads(json.dumps(calibrator.to_dict()))
    assert data["method"] == "histogram"
    restored = HistogramCalibrator._from_state(data["params"], data["state"])
    np.testing.assert_array_equal(restored.predict(queries), out)
