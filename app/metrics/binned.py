"""The binned expected calibration error (ECE) family, and ACE.

Bin-edge convention (calibd's, everywhere): bins are left-closed, bin k holds
predictions in [e_k, e_{k+1}), and the last bin is closed, [e_{B-1}, 1], so
that a probability of exactly 1.0 falls in it. This is netcal's convention
(``np.histogramdd``); scikit-learn's ``calibration_curve`` is right-closed,
(e_k, e_{k+1}], which differs only for predictions exactly on an interior edge.

* ``uniform`` binning: e_k = k / B (``np.linspace(0, 1, B + 1)``);
* ``quantile`` binning: equal mass, interior edges at the quantiles
  ``np.quantile(p, k / B)`` (linear interpolation, the weights ignored), with
  e_0 = 0 and e_B = 1, as netcal's ``equal_intervals=False``. Tied predictions
  can make a bin empty; empty bins are skipped.

For one binary problem (prediction p_i, outcome y_i in {0, 1}, weight w_i)
with W_b the weight in bin b, ybar_b the weighted mean outcome and pbar_b the
weighted mean prediction there:

    ECE   (norm l1)  = sum_b (W_b / W) |ybar_b - pbar_b|        Naeini, Cooper & Hauskrecht (2015)
    RMSCE (norm l2)  = sqrt(sum_b (W_b / W) (ybar_b - pbar_b)^2)
    MCE   (norm max) = max over non-empty bins of |ybar_b - pbar_b|

The ``target`` (see :mod:`calibd.metrics.inputs`) says which binary problems:
``binary``, ``top_label`` (confidence against accuracy, Guo et al. 2017) or
``classwise`` (Kull et al. 2019). Over the K classwise problems the values are
combined by the same norm: the mean (l1), the root mean square (l2), the
maximum (max).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .inputs import Prepared, binary_problems, input_error, prepare, resolve_target

BINNINGS = ("uniform", "quantile")
NORMS = ("l1", "l2", "max")
DEFAULT_N_BINS = 15
MAX_N_BINS = 100_000


def check_n_bins(n_bins: Any, field: str = "options.n_bins") -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or not 1 <= n_bins <= MAX_N_BINS:
        raise input_error(field, f"must be an integer from 1 to {MAX_N_BINS}")
    return int(n_bins)


def check_choice(value: Any, choices: tuple[str, ...], field: str) -> str:
    if value not in choices:
        raise input_error(field, f"must be one of {', '.join(choices)}")
    return value


def bin_edges(probabilities: np.ndarray, n_bins: int, binning: str = "uniform") -> np.ndarray:
    """B + 1 edges from 0 to 1: equal width, or equal mass (quantiles of the predictions)."""
    if binning == "uniform":
        return np.linspace(0.0, 1.0, n_bins + 1)
    if binning == "quantile":
        edges = np.quantile(probabilities, np.linspace(0.0, 1.0, n_bins + 1))
        edges[0], edges[-1] = 0.0, 1.0
        return edges
    raise ValueError(f"binning must be 'uniform' or 'quantile', not {binning!r}")


def assign_bins(probabilities: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Index of the left-closed bin [e_k, e_{k+1}) of each prediction; 1.0 goes to the last bin."""
    n_bins = edges.shape[0] - 1
    return np.clip(np.searchsorted(edges, probabilities, side="right") - 1, 0, n_bins - 1)


_GRID = 1 << 16  # cells of the lookup table in fast_assign_bins


def fast_assign_bins(probabilities: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``assign_bins(p, edges)``, exactly, without a binary search per prediction.

    With G = 2^16, c = floor(p G) is exact (scaling by a power of two does not
    round), so c / G <= p. A table gives the bin of each c / G; from there a
    prediction can only be one or more edges further right, and as many steps
    ``bin += p >= upper[bin]`` as the most edges inside one cell (1 for
    ordinary edges) reach the bin of the ``searchsorted`` convention
    (tested on edges, their neighbours and repeated edges). About half the
    cost of ``np.searchsorted`` on 10^7 predictions. Predictions must lie in
    [0, 1] (validated inputs do).
    """
    table = assign_bins(np.arange(_GRID + 1, dtype=np.float64) / _GRID, edges)
    interior = edges[1:-1]
    inside = interior[(interior > 0) & (interior < 1)]
    steps = int(np.bincount((inside * _GRID).astype(np.intp)).max()) if inside.size else 0
    bins = table[(probabilities * _GRID).astype(np.intp)]
    if steps:
        upper = edges[1:].copy()
        upper[-1] = np.inf  # the last bin is closed
        for _ in range(steps):  # never past the last bin: its upper edge is infinite
            bins += probabilities >= upper[bins]
    return bins


def uniform_bins(probabilities: np.ndarray, n_bins: int) -> np.ndarray:
    """The bins of ``np.linspace(0, 1, B + 1)``: ``fast_assign_bins`` on the uniform edges."""
    return fast_assign_bins(probabilities, np.linspace(0.0, 1.0, n_bins + 1))


def bin_index(p: np.ndarray, n_bins: int, binning: str) -> tuple[np.ndarray, np.ndarray]:
    """(edges, bin of each prediction) under calibd's convention."""
    edges = bin_edges(p, n_bins, binning)
    return edges, fast_assign_bins(p, edges)


def bin_gaps(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, bins: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Per bin: the weight W_b and the weighted sum of (y - p). Two ``np.bincount`` calls."""
    if w is None:
        mass = np.bincount(bins, minlength=n_bins).astype(np.float64)
        gap = np.bincount(bins, weights=y - p, minlength=n_bins)
    else:
        mass = np.bincount(bins, weights=w, minlength=n_bins)
        gap = np.bincount(bins, weights=w * (y - p), minlength=n_bins)
    return mass, gap


def _binary_ce(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, n_bins: int, binning: str, norm: str) -> float:
    _, bins = bin_index(p, n_bins, binning)
    mass, gap_sum = bin_gaps(p, y, w, bins, n_bins)
    nonempty = mass > 0
    gaps = np.abs(gap_sum[nonempty] / mass[nonempty])
    share = mass[nonempty] / mass.sum()
    if norm == "l1":
        return float(np.dot(share, gaps))
    if norm == "l2":
        return float(np.sqrt(np.dot(share, gaps**2)))
    return float(gaps.max())


def combine(values: list[float], norm: str) -> float:
    """Combine per-class values by the norm: mean (l1), root mean square (l2), maximum (max)."""
    array = np.asarray(values, dtype=np.float64)
    if norm == "l2":
        return float(np.sqrt(np.mean(array**2)))
    if norm == "max":
        return float(array.max())
    return float(array.mean())


def ece(
    probabilities,
    labels,
    n_bins: int = DEFAULT_N_BINS,
    binning: str = "uniform",
    norm: str = "l1",
    sample_weight=None,
    target: str | None = None,
) -> float:
    """Binned calibration error: ECE (``l1``), RMSCE (``l2``) or MCE (``max``); see the module docstring.

    ``probabilities`` is ``(n,)`` (probability of class 1, labels 0/1) or
    ``(n, K)`` (labels ``0..K-1``); ``target`` defaults to ``binary`` for flat
    input and ``top_label`` for rows.
    """
    data = prepare(probabilities, labels, sample_weight)
    n_bins = check_n_bins(n_bins)
    check_choice(binning, BINNINGS, "options.binning")
    check_choice(norm, NORMS, "options.norm")
    target = resolve_target(data, target)
    return ece_prepared(data, n_bins, binning, norm, target)


def ece_prepared(data: Prepared, n_bins: int, binning: str, norm: str, target: str) -> float:
    w = data.w
    values = [_binary_ce(p, y, w, n_bins, binning, norm) for p, y in binary_problems(data, target)]
    return values[0] if len(values) == 1 else combine(values, norm)


def _binary_ace(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, n_ranges: int) -> tuple[float, int]:
    order = np.argsort(p, kind="stable")
    n = p.shape[0]
    if w is None:
        ranges = (np.arange(n, dtype=np.int64) * n_ranges) // n
        mass = np.bincount(ranges, minlength=n_ranges).astype(np.float64)
        gap = np.bincount(ranges, weights=(y - p)[order], minlength=n_ranges)
    else:
        ws = w[order]
        before = np.concatenate(([0.0], np.cumsum(ws)[:-1]))
        ranges = np.minimum((n_ranges * before / ws.sum()).astype(np.intp), n_ranges - 1)
        mass = np.bincount(ranges, weights=ws, minlength=n_ranges)
        gap = np.bincount(ranges, weights=(ws * (y[order] - p[order])), minlength=n_ranges)
    nonempty = mass > 0
    gaps = np.abs(gap[nonempty] / mass[nonempty])
    return float(gaps.sum()), int(nonempty.sum())


def ace(probabilities, labels, n_bins: int = DEFAULT_N_BINS, sample_weight=None, target: str | None = None) -> float:
    """Adaptive calibration error (Nixon et al. 2019, "Measuring calibration in deep learning").

    For each class k, the predictions for k are sorted and cut into R ranges
    of equal mass; ACE = (1 / (K R)) sum_k sum_r |ybar_{k,r} - pbar_{k,r}|,
    the unweighted mean gap over all non-empty (class, range) cells. A sample
    belongs to range floor(R * C / W), C being the weight sorted before it:
    with unit weights that is floor(R i / n) for the i-th smallest (i from 0),
    n/R samples per range when R divides n. Ties are cut in input order.

    ``target`` defaults to ``classwise`` for multiclass rows (Nixon's
    definition, all K classes) and ``binary`` for flat input (the positive
    class alone: the class-0 ranges mirror the class-1 ranges with the same gaps).
    """
    data = prepare(probabilities, labels, sample_weight)
    n_bins = check_n_bins(n_bins)
    if target is None:
        target = "binary" if data.binary else "classwise"
    target = resolve_target(data, target)
    return ace_prepared(data, n_bins, target)


def ace_prepared(data: Prepared, n_bins: int, target: str) -> float:
    total, cells = 0.0, 0
    for p, y in binary_problems(data, target):
        s, c = _binary_ace(p, y, data.w, n_bins)
        total += s
        cells += c
    return total / cells
