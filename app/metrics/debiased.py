"""The debiased l2 calibration error of Kumar, Liang & Ma (2019), "Verified uncertainty calibration".

The plug-in estimate of the squared l2 calibration error over bins,
sum_b (n_b / n) (pbar_b - ybar_b)^2, is biased upwards: (ybar_b)^2 carries
the sampling variance of the label mean. Kumar et al. subtract an unbiased
estimate of it in every bin:

    CE^2 = sum_b (n_b / n) [ (pbar_b - ybar_b)^2 - ybar_b (1 - ybar_b) / (n_b - 1) ]
    value = sqrt(max(CE^2, 0))

The value is the root (the l2 error, comparable with RMSCE), as
``calibration.get_calibration_error(probs, labels, p=2, debias=True)`` of PyPI
``uncertainty-calibration`` returns it. Bins holding fewer than 2 samples
contribute 0 (their mass still counts in n), as in that package. Binnings:

* ``quantile`` (the package's default for continuous outputs,
  ``get_equal_bins``): the sorted predictions are cut into B chunks as by
  ``np.array_split`` (the first n mod B chunks one larger), an edge is placed
  midway between the last value of a chunk and the first of the next, repeated
  edges are merged, and 1.0 closes the last bin. Bins are **right-closed**,
  (e_{b-1}, e_b], as the package's ``np.searchsorted(bins, p)`` assigns them;
  B is reduced to n when n < B.
* ``discrete``: one bin per distinct prediction (the package's
  ``get_binning_ce``, which ``get_calibration_error`` picks when fewer than n/4
  distinct values occur, i.e. for the outputs of a binning calibrator).
* ``uniform``: calibd's left-closed equal-width bins (see
  :mod:`calibd.metrics.binned`); the package's equal-width bins are right-closed,
  which differs only for predictions exactly on an edge.

Targets: ``binary``, ``top_label`` (the package's ``mode='top-label'``), and
``classwise`` (``mode='marginal'``): sqrt(mean_k max(CE_k^2, 0)).

Sample weights: bin means are weighted, n_b / n becomes W_b / W, and n_b - 1
becomes n_eff,b - 1 with the effective count n_eff = (sum w)^2 / sum w^2
(for fixed weights E[ybar(1 - ybar)] = mu (1 - mu)(1 - 1/n_eff), so the
correction stays unbiased). A bin needs 2 samples of positive weight.
"""

from __future__ import annotations

import numpy as np

from .binned import DEFAULT_N_BINS, bin_index, check_choice, check_n_bins
from .inputs import Prepared, binary_problems, prepare, resolve_target

BINNINGS = ("quantile", "uniform", "discrete")


def kumar_equal_mass_edges(p: np.ndarray, n_bins: int) -> np.ndarray:
    """The upper edges of ``uncertainty-calibration``'s ``get_equal_bins`` (ending with 1.0)."""
    s = np.sort(p)
    n = s.shape[0]
    n_bins = min(n_bins, n)
    q, r = divmod(n, n_bins)
    sizes = np.full(n_bins, q, dtype=np.int64)
    sizes[:r] += 1
    starts = np.cumsum(sizes)[:-1]  # first index of chunks 1..B-1
    edges = (s[starts - 1] + s[starts]) / 2.0
    return np.unique(np.concatenate((edges, [1.0])))


def _bins(p: np.ndarray, n_bins: int, binning: str) -> tuple[np.ndarray, int]:
    if binning == "quantile":
        edges = kumar_equal_mass_edges(p, n_bins)
        return np.searchsorted(edges, p, side="left"), edges.shape[0]
    if binning == "discrete":
        values, inverse = np.unique(p, return_inverse=True)
        return inverse.ravel(), values.shape[0]
    _, bins = bin_index(p, n_bins, "uniform")
    return bins, n_bins


def _squared(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, n_bins: int, binning: str) -> float:
    bins, m = _bins(p, n_bins, binning)
    if w is None:
        count = np.bincount(bins, minlength=m).astype(np.float64)
        mass, n_eff, support = count, count, count
        sum_p = np.bincount(bins, weights=p, minlength=m)
        sum_y = np.bincount(bins, weights=y, minlength=m)
    else:
        mass = np.bincount(bins, weights=w, minlength=m)
        squares = np.bincount(bins, weights=w * w, minlength=m)
        support = np.bincount(bins, weights=(w > 0).astype(np.float64), minlength=m)
        n_eff = np.divide(mass**2, squares, out=np.zeros(m), where=squares > 0)
        sum_p = np.bincount(bins, weights=w * p, minlength=m)
        sum_y = np.bincount(bins, weights=w * y, minlength=m)
    used = support >= 2
    pbar = sum_p[used] / mass[used]
    ybar = sum_y[used] / mass[used]
    per_bin = (pbar - ybar) ** 2 - ybar * (1.0 - ybar) / (n_eff[used] - 1.0)
    return float(np.dot(mass[used] / mass.sum(), per_bin))


def debiased_l2_ce(
    probabilities,
    labels,
    n_bins: int = DEFAULT_N_BINS,
    binning: str = "quantile",
    sample_weight=None,
    target: str | None = None,
) -> float:
    """Kumar et al.'s debiased l2 calibration error (the root); see the module docstring."""
    data = prepare(probabilities, labels, sample_weight)
    n_bins = check_n_bins(n_bins)
    check_choice(binning, BINNINGS, "options.binning")
    target = resolve_target(data, target)
    return debiased_prepared(data, n_bins, binning, target)


def debiased_prepared(data: Prepared, n_bins: int, binning: str, target: str) -> float:
    squares = [max(_squared(p, y, data.w, n_bins, binning), 0.0) for p, y in binary_problems(data, target)]
    return float(np.sqrt(np.mean(squares)))
