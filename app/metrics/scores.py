"""Proper scoring rules: Brier score with its Murphy decomposition, and log-loss.

Binary input is ``(n,)``, the probability of class 1; multiclass input is
``(n, K)`` rows with labels ``0..K-1``. Y is the one-hot label.

    Brier, binary      = sum_i w_i (p_i - y_i)^2 / W                     (Brier 1950)
    Brier, multiclass  = sum_i w_i sum_k (P_ik - Y_ik)^2 / W             (in [0, 2])
    log-loss, binary   = -sum_i w_i [y_i log p_i + (1 - y_i) log(1 - p_i)] / W
    log-loss, multiclass = -sum_i w_i log P_{i, y_i} / W

The binary Brier score is the one of scikit-learn's ``brier_score_loss``
(positive class only); the multiclass one sums over all K classes, so a
two-column input scores twice its flat binary form.
"""

from __future__ import annotations

import numpy as np

from .binned import BINNINGS, DEFAULT_N_BINS, bin_index, check_choice, check_n_bins
from .inputs import Prepared, prepare

# Probabilities are clipped to [LOG_LOSS_EPS, 1 - LOG_LOSS_EPS] so that a
# confident miss costs a large finite amount, as in scikit-learn's log_loss.
LOG_LOSS_EPS = 1e-15


def _mean(values: np.ndarray, w: np.ndarray | None) -> float:
    if w is None:
        return float(values.mean())
    return float(np.dot(w, values) / w.sum())


def brier(probabilities, labels, sample_weight=None) -> float:
    """Mean squared error of the probabilities against the one-hot labels (see the module docstring)."""
    return brier_prepared(prepare(probabilities, labels, sample_weight))


def brier_prepared(data: Prepared) -> float:
    p, y = data.p, data.y
    if data.binary:
        return _mean((p - y) ** 2, data.w)
    rows = np.arange(p.shape[0])
    picked = p[rows, y]
    # sum_k (P_k - Y_k)^2 = sum_k P_k^2 - 2 P_y + 1
    per_row = np.einsum("ij,ij->i", p, p) - 2.0 * picked + 1.0
    return _mean(per_row, data.w)


def log_loss(probabilities, labels, sample_weight=None) -> float:
    """Mean negative log-likelihood of the labels (see the module docstring)."""
    return log_loss_prepared(prepare(probabilities, labels, sample_weight))


def log_loss_prepared(data: Prepared) -> float:
    p, y = data.p, data.y
    if data.binary:
        q = np.clip(p, LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS)
        # Each row's own term only, not both then a pick: the same floats, half the logarithms.
        positive = y == 1
        per_row = np.empty_like(q)
        np.log(q, out=per_row, where=positive)
        np.log1p(np.negative(q, out=q), out=per_row, where=~positive)
        return -_mean(per_row, data.w)
    picked = np.clip(p[np.arange(p.shape[0]), y], LOG_LOSS_EPS, 1.0)
    return -_mean(np.log(picked), data.w)


def brier_decomposition(
    probabilities, labels, n_bins: int = DEFAULT_N_BINS, binning: str = "uniform", sample_weight=None
) -> dict[str, float]:
    """Murphy's (1973) decomposition of the Brier score over calibd's bins.

    The predictions of each class column are binned as the ECE bins them
    (``binning`` uniform or quantile, ``n_bins``, left-closed with 1.0 in the
    last bin). With W_b, pbar_b and ybar_b the weight, mean prediction and
    outcome frequency of bin b, and ybar the overall frequency:

        reliability = sum_b (W_b / W) (pbar_b - ybar_b)^2
        resolution  = sum_b (W_b / W) (ybar_b - ybar)^2
        uncertainty = ybar (1 - ybar)

    summed over the classes for multiclass input (over class 1 alone for
    binary). Then, exactly (Stephenson, Coelho & Jolliffe 2008),

        Brier = reliability - resolution + uncertainty + WBV - WBC

    with the within-bin variance WBV = sum_i w_i (p_i - pbar_b)^2 / W and
    covariance WBC = 2 sum_i w_i (p_i - pbar_b)(y_i - ybar_b) / W, both
    returned. Brier = REL - RES + UNC holds exactly only when the predictions
    are constant within each bin (WBV = WBC = 0), e.g. for binned forecasts.
    """
    data = prepare(probabilities, labels, sample_weight)
    n_bins = check_n_bins(n_bins)
    check_choice(binning, BINNINGS, "options.binning")
    return brier_decomposition_prepared(data, n_bins, binning)


def brier_decomposition_prepared(data: Prepared, n_bins: int, binning: str) -> dict[str, float]:
    if data.binary:
        columns = [(data.p, data.y.astype(np.float64))]
    else:
        columns = [(np.ascontiguousarray(data.p[:, k]), (data.y == k).astype(np.float64)) for k in range(data.n_classes)]
    w = np.ones(data.n) if data.w is None else data.w
    total = w.sum()
    rel = res = unc = wbv = wbc = 0.0
    for p, y in columns:
        _, bins = bin_index(p, n_bins, binning)
        mass = np.bincount(bins, weights=w, minlength=n_bins)
        nonempty = mass > 0
        safe = np.where(nonempty, mass, 1.0)
        pbar = np.bincount(bins, weights=w * p, minlength=n_bins) / safe
        ybar_b = np.bincount(bins, weights=w * y, minlength=n_bins) / safe
        ybar = float(np.dot(w, y) / total)
        share = mass / total
        rel += float(np.dot(share, (pbar - ybar_b) ** 2))
        res += float(np.dot(share, (ybar_b - ybar) ** 2))
        unc += ybar * (1.0 - ybar)
        dp = p - pbar[bins]
        wbv += float(np.dot(w, dp**2) / total)
        wbc += float(2.0 * np.dot(w, dp * (y - ybar_b[bins])) / total)
    return {
        "brier": brier_prepared(data),
        "reliability": rel,
        "resolution": res,
        "uncertainty": unc,
        "within_bin_variance": wbv,
        "within_bin_covariance": wbc,
    }
