"""Hand-computed cases for every estimator in calibd.metrics, and their conventions.

Each small case is worked out in the comments next to it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import isotonic_regression
from scipy.stats import norm

from calibd.calibration import CalibrationInputError
from calibd.calibration.isotonic import IsotonicCalibrator
from calibd.metrics import (
    DEFAULT_METRICS,
    ace,
    bin_edges,
    bootstrap_ci,
    brier,
    brier_decomposition,
    debiased_l2_ce,
    ece,
    evaluate,
    interval_calibration,
    ks_error,
    log_loss,
    lp_error,
    reliability_diagram,
    smooth_ece,
    spiegelhalter,
    wilson_interval,
)
from calibd.metrics.binned import assign_bins, fast_assign_bins, uniform_bins
from calibd.metrics.debiased import kumar_equal_mass_edges

# Four rows of three classes, used by several cases:
#   row  probabilities     label  top class  confidence  correct
#   r0   [0.7, 0.2, 0.1]   0      0          0.7         1
#   r1   [0.6, 0.3, 0.1]   1      0          0.6         0
#   r2   [0.2, 0.5, 0.3]   1      1          0.5         1
#   r3   [0.1, 0.1, 0.8]   2      2          0.8         1
ROWS = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
ROW_LABELS = np.array([0, 1, 1, 2])


def random_binary(n: int, seed: int = 0, power: float = 1.3):
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    return p, (rng.random(n) < p**power).astype(np.int64)


def random_multiclass(n: int, k: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, k))
    truth = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = (truth.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1)
    sharp = np.exp(1.5 * logits)
    return sharp / sharp.sum(axis=1, keepdims=True), labels


# --- ECE family ----------------------------------------------------------------------------


def test_ece_top_label_by_hand():
    # n_bins = 2: every confidence (0.7, 0.6, 0.5, 0.8) is in [0.5, 1]:
    # mean confidence 2.6 / 4 = 0.65, accuracy 3/4 -> ECE 0.1.
    assert ece(ROWS, ROW_LABELS, n_bins=2) == pytest.approx(0.1)
    # n_bins = 4: [0.5, 0.75) holds 0.7, 0.6, 0.5 (mean 0.6, accuracy 2/3, gap 1/15, mass 3/4);
    # [0.75, 1] holds 0.8 (accuracy 1, gap 0.2, mass 1/4).
    assert ece(ROWS, ROW_LABELS, n_bins=4) == pytest.approx(0.75 / 15 + 0.25 * 0.2)
    assert ece(ROWS, ROW_LABELS, n_bins=4, norm="max") == pytest.approx(0.2)
    assert ece(ROWS, ROW_LABELS, n_bins=4, norm="l2") == pytest.approx(math.sqrt(0.75 / 225 + 0.25 * 0.04))


def test_ece_classwise_by_hand():
    # n_bins = 2, bins [0, 0.5) and [0.5, 1]:
    # class 0: p (0.7, 0.6, 0.2, 0.1), y (1, 0, 0, 0): low bin mean 0.15 freq 0, high mean 0.65 freq 0.5 -> 0.15
    # class 1: p (0.2, 0.3, 0.5, 0.1), y (0, 1, 1, 0): low (0.2, 0.3, 0.1) mean 0.2 freq 1/3, gap 2/15, mass 3/4;
    #          high (0.5) freq 1, gap 0.5, mass 1/4 -> 0.1 + 0.125 = 0.225; its MCE is 0.5
    # class 2: p (0.1, 0.1, 0.3, 0.8), y (0, 0, 0, 1): low mean 1/6 freq 0, mass 3/4 -> 0.125; high gap 0.2 -> 0.05
    #          -> 0.175
    assert ece(ROWS, ROW_LABELS, n_bins=2, target="classwise") == pytest.approx((0.15 + 0.225 + 0.175) / 3)
    assert ece(ROWS, ROW_LABELS, n_bins=2, target="classwise", norm="max") == pytest.approx(0.5)


def test_ece_binary_input_targets():
    p, y = [0.2, 0.9, 0.5], [0, 1, 1]
    # top label of (1 - p, p): confidences 0.8, 0.9, 0.5 with predicted classes 0, 1, 0 (0 on the tie)
    # -> correct 1, 1, 0. One bin: |2/3 - 2.2/3| = 0.2/3.
    assert ece(p, y, n_bins=1, target="top_label") == pytest.approx(0.2 / 3)
    # binary: one bin, |2/3 - 1.6/3| = 0.4/3
    assert ece(p, y, n_bins=1) == pytest.approx(0.4 / 3)
    # classwise on flat input: classes (1 - p, p) have the same gap in one bin
    assert ece(p, y, n_bins=1, target="classwise") == pytest.approx(0.4 / 3)
    # two columns with target binary is column 1
    two = np.column_stack([1 - np.array(p), p])
    assert ece(two, y, n_bins=3, target="binary") == pytest.approx(ece(p, y, n_bins=3))


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 20, 33, 100, 1000, 4097])
def test_uniform_bins_match_searchsorted_exactly(n_bins):
    rng = np.random.default_rng(n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    around = np.concatenate([edges, np.nextafter(edges, 0.0), np.nextafter(edges, 1.0), np.nextafter(edges, 2.0)])
    p = np.clip(np.concatenate([rng.random(20_000), around, [0.0, 1.0]]), 0.0, 1.0)
    np.testing.assert_array_equal(uniform_bins(p, n_bins), assign_bins(p, edges))


@pytest.mark.parametrize(
    "interior",
    [
        [0.3, 0.3, 0.5],  # a repeated (tied quantile) edge
        [0.25, 0.5, 0.75],  # edges exactly on cells of the lookup grid
        [1e-300, 0.1, 0.1 + 2**-60, 0.1 + 2**-50, 1 - 2**-53],  # several edges inside one grid cell
        list(np.sort(np.random.default_rng(0).random(40))),
    ],
)
def test_fast_assignment_matches_searchsorted_on_any_edges(interior):
    edges = np.concatenate([[0.0], interior, [1.0]])
    rng = np.random.default_rng(1)
    around = np.concatenate([edges, np.nextafter(edges, 0.0), np.nextafter(edges, 1.0), np.nextafter(edges, 2.0)])
    p = np.clip(np.concatenate([rng.random(20_000), around]), 0.0, 1.0)
    np.testing.assert_array_equal(fast_assign_bins(p, edges), assign_bins(p, edges))


def test_quantile_edges_are_netcal_s():
    p, _ = random_binary(101)
    edges = bin_edges(p, 4, "quantile")
    assert edges[0] == 0.0 and edges[-1] == 1.0
    np.testing.assert_array_equal(edges[1:-1], np.quantile(p, [0.25, 0.5, 0.75]))


def test_ece_weights_are_multiplicities_and_scale_free():
    p, y = random_binary(300, seed=3)
    w = np.random.default_rng(4).integers(0, 4, 300)
    repeated = ece(np.repeat(p, w), np.repeat(y, w), n_bins=10)
    assert ece(p, y, n_bins=10, sample_weight=w) == pytest.approx(repeated, abs=1e-12)
    assert ece(p, y, n_bins=10, sample_weight=3.0 * w) == pytest.approx(repeated, abs=1e-12)


# --- debiased l2 (Kumar et al.) -----------------------------------------------------------


def test_debiased_l2_by_hand():
    # Bin A: p = 0.1 three times, y = 1, 1, 0: ybar 2/3, (0.1 - 2/3)^2 = 0.321111, minus (2/3)(1/3)/2 = 0.111111 -> 0.21
    # Bin B: p = 0.9 three times, y = 1, 1, 1: (0.9 - 1)^2 = 0.01, minus 0 -> 0.01
    # CE^2 = 0.5 * 0.21 + 0.5 * 0.01 = 0.11, value sqrt(0.11); the plug-in would be sqrt(0.165556).
    p = [0.1, 0.1, 0.1, 0.9, 0.9, 0.9]
    y = [1, 1, 0, 1, 1, 1]
    assert debiased_l2_ce(p, y, binning="discrete") == pytest.approx(math.sqrt(0.11))
    # Equal-mass, 2 bins: the edge is midway between the chunks (0.1 + 0.9) / 2 = 0.5: the same bins.
    assert debiased_l2_ce(p, y, n_bins=2) == pytest.approx(math.sqrt(0.11))
    # A negative debiased square is reported as 0: p = 0.5 twice with y = 0, 1:
    # (0.5 - 0.5)^2 - 0.25 / 1 < 0.
    assert debiased_l2_ce([0.5, 0.5], [0, 1], binning="discrete") == 0.0


def test_kumar_equal_mass_edges_follow_array_split():
    # n = 7, B = 3: chunks of 3, 2, 2 -> edges between s[2], s[3] and s[4], s[5], then 1.0.
    s = np.array([0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.9])
    np.testing.assert_allclose(kumar_equal_mass_edges(s[::-1], 3), [0.25, 0.55, 1.0])
    # bins are right-closed: 0.25 itself would go to the first bin
    assert np.searchsorted(kumar_equal_mass_edges(s, 3), 0.25, side="left") == 0


def test_debiased_weights_unit_and_scaled():
    p, y = random_binary(500, seed=5)
    base = debiased_l2_ce(p, y)
    assert debiased_l2_ce(p, y, sample_weight=np.ones(500)) == pytest.approx(base, abs=1e-15)
    w = np.random.default_rng(1).random(500)
    assert debiased_l2_ce(p, y, sample_weight=w) == pytest.approx(debiased_l2_ce(p, y, sample_weight=7 * w), abs=1e-12)


# --- smooth ECE -----------------------------------------------------------------------------


def test_smooth_ece_zero_when_residuals_cancel_at_every_point():
    # Two predictions at 0.5 with labels 0 and 1: the residuals +0.5 and -0.5 land on the same grid point.
    value, sigma = smooth_ece([0.5, 0.5], [0, 1], return_sigma=True)
    assert value == 0.0
    assert sigma == pytest.approx(2.0**-9)  # the bisection ends below eps = 0.001 after 10 halvings


def test_smooth_ece_constant_gap():
    # Every prediction is 0.2 and every label 1: the smoothed residual is -0.8 wherever there is
    # density, so smECE is 0.8 (less the eps = 1e-4 added to the density), and sigma* = smECE.
    value, sigma = smooth_ece(np.full(50, 0.2), np.ones(50, dtype=int), return_sigma=True)
    assert value == pytest.approx(0.8, abs=2e-3)
    assert sigma == pytest.approx(value, abs=2e-3)


def test_smooth_ece_weights_scale_free():
    p, y = random_binary(400, seed=6)
    w = np.random.default_rng(2).random(400)
    assert smooth_ece(p, y, sample_weight=w) == pytest.approx(smooth_ece(p, y, sample_weight=5 * w), abs=1e-12)
    assert smooth_ece(p, y, sample_weight=np.ones(400)) == pytest.approx(smooth_ece(p, y), abs=1e-15)


# --- ACE ------------------------------------------------------------------------------------


def test_ace_binary_by_hand():
    # 8 predictions, R = 4 ranges of 2 after sorting:
    # (0.1, 0.2) y (0, 0): |0 - 0.15| = 0.15;  (0.3, 0.4) y (1, 1): 0.65;
    # (0.6, 0.7) y (1, 1): 0.35;               (0.8, 0.9) y (1, 1): 0.15    -> mean 1.3 / 4
    p = [0.9, 0.1, 0.3, 0.2, 0.4, 0.6, 0.7, 0.8]
    y = [1, 0, 1, 0, 1, 1, 1, 1]
    assert ace(p, y, n_bins=4) == pytest.approx(1.3 / 4)


def test_ace_multiclass_by_hand():
    # R = 2 per class (ranges of 2 after sorting each column):
    # class 0: (0.1, 0.2) y 0, 0 -> 0.15;  (0.6, 0.7) y 0, 1 -> |0.5 - 0.65| = 0.15
    # class 1: (0.1, 0.2) y 0, 0 -> 0.15;  (0.3, 0.5) y 1, 1 -> 0.6
    # class 2: (0.1, 0.1) y 0, 0 -> 0.1;   (0.3, 0.8) y 0, 1 -> |0.5 - 0.55| = 0.05
    # mean over the 6 cells: 1.2 / 6
    assert ace(ROWS, ROW_LABELS, n_bins=2) == pytest.approx(0.2)


# --- KS, interval calibration, Spiegelhalter ------------------------------------------------


def test_ks_and_interval_by_hand():
    # Sorted by p: residuals y - p = 0.8, -0.4, -0.6, 0.2; partial sums S = 0, 0.8, 0.4, -0.2, 0.0.
    # KS = max |S| / n = 0.8 / 4; interval = (max S - min S) / n = 1.0 / 4 (the interval (0.2, 0.6]).
    p, y = [0.6, 0.2, 0.8, 0.4], [0, 1, 1, 0]
    assert ks_error(p, y) == pytest.approx(0.2)
    assert interval_calibration(p, y) == pytest.approx(0.25)
    # Weighted (1, 1, 2, 1 in sorted order): S = 0, 0.8, 0.4, -0.8, -0.6 over W = 5.
    w = [2, 1, 1, 1]
    assert ks_error(p, y, sample_weight=w) == pytest.approx(0.16)
    assert interval_calibration(p, y, sample_weight=w) == pytest.approx(0.32)


def test_ties_are_never_split():
    # Two predictions of 0.5 with labels 1 and 0 form one run with sum 0: both statistics are 0,
    # in either order (a prefix inside the run would give 0.5 / 2).
    for y in ([1, 0], [0, 1]):
        assert interval_calibration([0.5, 0.5], y) == 0.0
        assert ks_error([0.5, 0.5], y) == 0.0
        assert interval_calibration([0.5, 0.5], y, sample_weight=[1.0, 1.0]) == 0.0


def test_interval_multiples_and_bounds():
    p, y = random_binary(2000, seed=8)
    w = np.random.default_rng(9).integers(0, 3, 2000)
    assert interval_calibration(p, y, sample_weight=w) == pytest.approx(
        interval_calibration(np.repeat(p, w), np.repeat(y, w)), abs=1e-12
    )
    assert ks_error(p, y, sample_weight=w) == pytest.approx(ks_error(np.repeat(p, w), np.repeat(y, w)), abs=1e-12)
    ks, ic = ks_error(p, y), interval_calibration(p, y)
    assert ks <= ic <= 2 * ks


def test_interval_calibration_is_exactly_zero_for_isotonic_in_sample():
    rng = np.random.default_rng(10)
    scores = rng.normal(size=4000)
    labels = (rng.random(4000) < 1 / (1 + np.exp(-2 * scores))).astype(np.int64)
    # scipy's PAV on the labels sorted by score
    order = np.argsort(scores)
    fitted = isotonic_regression(labels[order].astype(float)).x
    assert interval_calibration(fitted, labels[order]) == 0.0
    # calibd's isotonic calibrator, in-sample, with and without weights (no floor: the raw fit)
    train, test = slice(0, 2000), slice(2000, None)
    calibrator = IsotonicCalibrator(input="logit", min_probability=0).fit(scores[train], labels[train])
    assert interval_calibration(calibrator.predict(scores[train]), labels[train]) == 0.0
    weights = rng.integers(1, 4, 2000).astype(float)
    weighted = IsotonicCalibrator(input="logit", min_probability=0).fit(scores[train], labels[train], sample_weight=weights)
    assert interval_calibration(weighted.predict(scores[train]), labels[train], sample_weight=weights) == 0.0
    # out of sample it is positive
    assert interval_calibration(calibrator.predict(scores[test]), labels[test]) > 0.005


def test_spiegelhalter_by_hand():
    # p = (0.2, 0.8), y = (1, 1): 1 - 2p = (0.6, -0.6);
    # numerator 0.8 * 0.6 + 0.2 * (-0.6) = 0.36; variance 2 * 0.36 * 0.16 = 0.1152.
    z, p_value = spiegelhalter([0.2, 0.8], [1, 1])
    assert z == pytest.approx(0.36 / math.sqrt(0.1152))
    assert p_value == pytest.approx(2 * norm.sf(0.36 / math.sqrt(0.1152)))
    # zero variance: undefined when nothing is observed against it, infinite when something is
    assert all(math.isnan(v) for v in spiegelhalter([0.5, 0.5], [0, 1]))
    assert spiegelhalter([0.0], [1]) == (math.inf, 0.0)


def test_spiegelhalter_is_about_standard_normal_under_calibration():
    rng = np.random.default_rng(11)
    zs = []
    for _ in range(200):
        p = rng.random(500)
        zs.append(spiegelhalter(p, (rng.random(500) < p).astype(int))[0])
    assert abs(np.mean(zs)) < 0.25 and 0.8 < np.std(zs) < 1.2


# --- l_p error (papers/001) -------------------------------------------------------------------


def test_lp_error_by_hand():
    # lambda = 10, vectors (1 - p, p): (0.85, 0.15) -> (8, 1); (0.82, 0.18) -> (8, 1); (0.28, 0.72) -> (2, 7).
    # Bin (8, 1): class 1 |0.15 + 0.18 - 1| / 3 = 0.67 / 3; class 0 |(0.85 - 1) + 0.82| / 3 = 0.67 / 3.
    # Bin (2, 7): class 1 |0.72 - 1| / 3 = 0.28 / 3; class 0 |0.28| / 3.
    p, y = [0.15, 0.18, 0.72], [0, 1, 1]
    cells = np.array([0.67, 0.67, 0.28, 0.28]) / 3
    assert lp_error(p, y, p=1, lam=10) == pytest.approx(cells.sum())
    assert lp_error(p, y, p=2, lam=10) == pytest.approx(np.sqrt((cells**2).sum()))
    assert lp_error(p, y, p="inf", lam=10) == pytest.approx(0.67 / 3)
    # lambda = 1: every vector rounds to (0, 0), one bin: class 1 |1.05 - 2| / 3, class 0 the same.
    assert lp_error(p, y, p="inf", lam=1) == pytest.approx(0.95 / 3)
    assert lp_error(p, y, p=1, lam=1) == pytest.approx(2 * 0.95 / 3)


def test_lp_error_multiclass_by_hand():
    # lambda = 2: rows floor(2 f) = (1, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1): three bins.
    # Bin A (r0, r1; labels 0, 1): class 0 |1.3 - 1| = 0.3, class 1 |0.5 - 1| = 0.5, class 2 0.2
    # Bin B (r2, label 1): 0.2, 0.5, 0.3.  Bin C (r3, label 2): 0.1, 0.1, 0.2.  All over n = 4.
    cells = np.array([0.3, 0.5, 0.2, 0.2, 0.5, 0.3, 0.1, 0.1, 0.2]) / 4
    assert lp_error(ROWS, ROW_LABELS, p=1, lam=2) == pytest.approx(cells.sum())
    assert lp_error(ROWS, ROW_LABELS, p=2, lam=2) == pytest.approx(np.sqrt((cells**2).sum()))
    assert lp_error(ROWS, ROW_LABELS, p="inf", lam=2) == pytest.approx(0.125)


def test_lp_error_many_classes_uses_row_unique():
    # (lambda + 1)^K overflows int64 for K = 40: np.unique on rows must give the same partition.
    probabilities, labels = random_multiclass(300, k=40, seed=12)
    from calibd.metrics.lp import bin_ids

    codes = np.floor(10 * probabilities).astype(np.int64)
    _, expected = np.unique(codes, axis=0, return_inverse=True)
    np.testing.assert_array_equal(bin_ids(codes, 10), expected.ravel())
    assert lp_error(probabilities, labels, p=2) > 0


# --- Brier, log-loss and the Murphy decomposition ---------------------------------------------


def test_brier_and_log_loss_multiclass_by_hand():
    rows, labels = ROWS[[0, 2]], [0, 1]
    # (0.3^2 + 0.2^2 + 0.1^2) = 0.14 and (0.2^2 + 0.5^2 + 0.3^2) = 0.38
    assert brier(rows, labels) == pytest.approx(0.26)
    assert log_loss(rows, labels) == pytest.approx(-(math.log(0.7) + math.log(0.5)) / 2)


def test_murphy_decomposition_by_hand_when_constant_within_bins():
    # Bins of 2: p = 0.1 (labels 0, 1) and p = 0.7 (labels 1, 1); overall frequency 0.75.
    # REL = 0.5 (0.1 - 0.5)^2 + 0.5 (0.7 - 1)^2 = 0.125; RES = 0.5 * 0.0625 * 2 = 0.0625;
    # UNC = 0.75 * 0.25 = 0.1875; Brier = (0.01 + 0.81 + 0.09 + 0.09) / 4 = 0.25 = REL - RES + UNC.
    d = brier_decomposition([0.1, 0.1, 0.7, 0.7], [0, 1, 1, 1], n_bins=2)
    assert d["reliability"] == pytest.approx(0.125)
    assert d["resolution"] == pytest.approx(0.0625)
    assert d["uncertainty"] == pytest.approx(0.1875)
    assert d["brier"] == pytest.approx(0.25)
    assert d["within_bin_variance"] == 0.0 and d["within_bin_covariance"] == 0.0


@pytest.mark.parametrize("multiclass", [False, True])
def test_murphy_identity(multiclass):
    if multiclass:
        p, y = random_multiclass(2000, k=3, seed=13)
    else:
        p, y = random_binary(2000, seed=13)
    w = np.random.default_rng(14).random(2000)
    for weights in (None, w):
        d = brier_decomposition(p, y, n_bins=10, sample_weight=weights)
        full = d["reliability"] - d["resolution"] + d["uncertainty"] + d["within_bin_variance"] - d["within_bin_covariance"]
        assert full == pytest.approx(d["brier"], abs=1e-12)
        # the three-term identity fails on continuous predictions...
        assert abs(d["reliability"] - d["resolution"] + d["uncertainty"] - d["brier"]) > 1e-6
    # ...and holds exactly once the predictions are constant within bins (the bin's mean prediction)
    if not multiclass:
        bins = uniform_bins(p, 10)
        means = np.bincount(bins, weights=p, minlength=10) / np.maximum(np.bincount(bins, minlength=10), 1)
        d = brier_decomposition(means[bins], y, n_bins=10)
        assert d["reliability"] - d["resolution"] + d["uncertainty"] == pytest.approx(d["brier"], abs=1e-14)


# --- reliability diagram and Wilson intervals ---------------------------------------------------


def test_reliability_diagram_by_hand():
    # bins [0, 0.5): 0.1, 0.2 with labels 0, 1; [0.5, 1]: 0.7, 1.0 with labels 1, 1.
    # Wilson 95%, f = 0.5, n = 2: centre 0.5, half 1.96 sqrt(0.125 + z^2/16) / (1 + z^2/2) -> [0.0945, 0.9055];
    # f = 1, n = 2: [0.3424, 1].
    d = reliability_diagram([0.1, 0.2, 0.7, 1.0], [0, 1, 1, 1], n_bins=2)
    low, high = d["bins"]
    assert (low["lower"], low["upper"], low["count"]) == (0.0, 0.5, 2)
    assert low["mean_prediction"] == pytest.approx(0.15) and low["observed_frequency"] == 0.5
    assert low["wilson"] == pytest.approx([0.09453120573423074, 0.9054687942657693])
    assert high["mean_prediction"] == pytest.approx(0.85) and high["observed_frequency"] == 1.0
    assert high["wilson"] == pytest.approx([0.34238022750665303, 1.0])


def test_reliability_empty_bins_weights_and_classwise():
    d = reliability_diagram([0.1, 0.9], [0, 1], n_bins=3, sample_weight=[1.0, 3.0])
    middle = d["bins"][1]
    assert middle["count"] == 0 and middle["mean_prediction"] is None and middle["wilson"] is None
    top = d["bins"][2]
    assert top["weight"] == 3.0 and top["effective_count"] == 1.0  # (3)^2 / 3^2
    # effective count in the Wilson interval: weights 1 and 3 in one bin -> n_eff = 16 / 10
    d = reliability_diagram([0.6, 0.7], [0, 1], n_bins=1, sample_weight=[1.0, 3.0])
    (only,) = d["bins"]
    low, high = wilson_interval(np.array([0.75]), np.array([1.6]))
    assert only["effective_count"] == pytest.approx(1.6) and only["wilson"] == pytest.approx([low[0], high[0]])
    classes = reliability_diagram(ROWS, ROW_LABELS, n_bins=2, target="classwise")["classes"]
    assert [c["class"] for c in classes] == [0, 1, 2]


# --- bootstrap --------------------------------------------------------------------------------


def test_bootstrap_is_seeded_and_covers_the_estimate():
    p, y = random_binary(1000, seed=15)
    a = bootstrap_ci(ece, p, y, n_resamples=200, seed=1, n_bins=10)
    b = bootstrap_ci(ece, p, y, n_resamples=200, seed=1, n_bins=10)
    assert a == b
    assert a[0] < ece(p, y, n_bins=10) < a[1]
    wide = bootstrap_ci(ece, p, y, n_resamples=200, seed=1, level=0.99, n_bins=10)
    assert wide[0] <= a[0] and wide[1] >= a[1]
    # the same resamples as evaluate's (paired intervals)
    result = evaluate(p, y, metrics=["ece"], options={"n_bins": 10, "bootstrap": {"n_resamples": 200, "seed": 1}})
    assert result["metrics"]["ece"]["ci"] == pytest.approx(a)


def test_bootstrap_of_an_undefined_statistic_is_none():
    assert bootstrap_ci(spiegelhalter, [0.5, 0.5, 0.5], [0, 1, 1], n_resamples=20) is None


# --- evaluate -----------------------------------------------------------------------------------


def test_evaluate_binary_and_multiclass_report_every_metric():
    p, y = random_binary(500, seed=16)
    result = evaluate(p, y)
    assert set(result) == {"metrics", "reliability"}
    assert list(result["metrics"]) == list(DEFAULT_METRICS)
    for entry in result["metrics"].values():
        assert set(entry) >= {"value", "ci", "params"} and isinstance(entry["value"], float)
    assert result["metrics"]["ece"]["value"] == pytest.approx(ece(p, y))
    assert result["metrics"]["ece"]["params"]["target"] == "binary"
    assert len(result["reliability"]["bins"]) == 15

    rows, labels = random_multiclass(500, k=5, seed=17)
    result = evaluate(rows, labels, options={"target": None, "n_bins": 10})
    assert list(result["metrics"]) == list(DEFAULT_METRICS)
    assert result["metrics"]["ece"]["params"]["target"] == "top_label"
    assert result["metrics"]["ace"]["params"]["target"] == "classwise"
    assert result["metrics"]["interval_calibration"]["value"] == pytest.approx(interval_calibration(rows, labels))
    assert result["metrics"]["lp_error_inf"]["params"] == {"p": "inf", "lambda": 10, "bins": "distinct rounded vectors floor(lambda f) / lambda"}
    assert set(result["metrics"]["brier"]["decomposition"]) >= {"reliability", "resolution", "uncertainty"}


def test_evaluate_classwise_leaves_out_spiegelhalter():
    rows, labels = random_multiclass(200, seed=18)
    result = evaluate(rows, labels, options={"target": "classwise"})
    assert "spiegelhalter_z" not in result["metrics"]
    assert "classes" in result["reliability"]
    with pytest.raises(CalibrationInputError) as error:
        evaluate(rows, labels, metrics=["ece", "spiegelhalter_z"], options={"target": "classwise"})
    assert (error.value.field, error.value.index) == ("metrics", (1,))


def test_rows_within_tolerance_are_renormalised():
    rows = ROWS * 1.0005  # each row sums to 1.0005
    assert ece(rows, ROW_LABELS, n_bins=4) == pytest.approx(ece(ROWS, ROW_LABELS, n_bins=4), abs=1e-15)


@pytest.mark.parametrize(
    ("call", "field", "index"),
    [
        (lambda: ece([0.1, 0.2, 0.3, float("nan")], [0, 1, 0, 1]), "probabilities", (3,)),
        (lambda: ece([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.2, float("inf")]], [0, 1, 0, 1]), "probabilities", (3, 1)),
        (lambda: ece([0.1, 1.2], [0, 1]), "probabilities", (1,)),
        (lambda: ece([[0.5, 0.5], [0.5, -0.1]], [0, 1]), "probabilities", (1, 1)),
        (lambda: ece([[0.5, 0.5], [0.5, 0.4]], [0, 1]), "probabilities", (1,)),
        (lambda: ece([[0.5, 0.5], [0.5, 0.5, 0.0]], [0, 1]), "probabilities", (1,)),
        (lambda: ece([[0.5], [0.5]], [0, 1]), "probabilities", None),
        (lambda: ece([0.1, "x"], [0, 1]), "probabilities", (1,)),
        (lambda: ece([], []), "probabilities", None),
        (lambda: ece([0.1, 0.2], [0, 1, 1]), "labels", None),
        (lambda: ece([0.1, 0.2], [0, 2]), "labels", (1,)),
        (lambda: ece(ROWS, [0, 1, 3, 0]), "labels", (2,)),
        (lambda: ece([0.1, 0.2], [0, 0.5]), "labels", (1,)),
        (lambda: ece([0.1, 0.2], [0, 1], sample_weight=[1, -1]), "sample_weight", (1,)),
        (lambda: ece([0.1, 0.2], [0, 1], sample_weight=[0, 0]), "sample_weight", None),
        (lambda: ece([0.1, 0.2], [0, 1], n_bins=0), "options.n_bins", None),
        (lambda: ece([0.1, 0.2], [0, 1], binning="log"), "options.binning", None),
        (lambda: ece(ROWS, ROW_LABELS, target="binary"), "options.target", None),
        (lambda: evaluate([0.1, 0.2], [0, 1], metrics=["ece", "nope"]), "metrics", (1,)),
        (lambda: evaluate([0.1, 0.2], [0, 1], options={"bins": 3}), "options.bins", None),
        (lambda: evaluate([0.1, 0.2], [0, 1], options={"lambda": 0}), "options.lambda", None),
        (lambda: evaluate([0.1, 0.2], [0, 1], options={"bootstrap": {"seed": -1}}), "options.bootstrap.seed", None),
        (lambda: evaluate([0.1, 0.2], [0, 1], options={"bootstrap": {"n": 3}}), "options.bootstrap.n", None),
    ],
)
def test_bad_input_names_the_field(call, field, index):
    with pytest.raises(CalibrationInputError) as error:
        call()
    assert error.value.field == field
    assert error.value.index == index


@pytest.mark.parametrize("multiclass", [False, True])
def test_every_metric_ignores_a_common_weight_scale_and_unit_weights(multiclass):
    p, y = random_multiclass(400, seed=19) if multiclass else random_binary(400, seed=19)
    w = np.random.default_rng(20).random(400) + 0.1
    plain = evaluate(p, y)["metrics"]
    ones = evaluate(p, y, sample_weight=np.ones(400))["metrics"]
    weighted = evaluate(p, y, sample_weight=w)["metrics"]
    scaled = evaluate(p, y, sample_weight=4.0 * w)["metrics"]
    for name in DEFAULT_METRICS:
        assert ones[name]["value"] == pytest.approx(plain[name]["value"], rel=1e-9, abs=1e-12), name
        assert scaled[name]["value"] == pytest.approx(weighted[name]["value"], rel=1e-9, abs=1e-12), name
