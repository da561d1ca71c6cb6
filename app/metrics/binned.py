"""The binned expected calibration error (ECE) family.

Bin edges are left-closed: bin k holds predictions in [e_k, e_{k+1}), and the
last bin is closed, [e_{B-1}, 1], so that a probability of exactly 1.0 falls in
it. With uniform binning e_k = k / B.

    ECE = sum_b (W_b / W) |ybar_b - pbar_b|

where W_b is the weight in bin b, ybar_b the weighted label mean and pbar_b
the weighted mean prediction. Naeini, Cooper & Hauskrecht (2015).
"""

from __future__ import annotations

import numpy as np


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


def ece(probabilities, labels, n_bins: int = 15, binning: str = "uniform", norm: str = "l1", sample_weight=None) -> float:
    """Binned calibration error of binary probabilities of class 1.

    ``norm`` is ``l1`` (ECE), ``l2`` (RMSCE, the root of the mass-weighted mean
    squared gap) or ``max`` (MCE, the largest gap over non-empty bins).
    """
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    w = np.ones(p.shape[0]) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    bins = assign_bins(p, bin_edges(p, n_bins, binning))
    mass = np.bincount(bins, weights=w, minlength=n_bins)
    gap_sum = np.bincount(bins, weights=w * (y - p), minlength=n_bins)
    nonempty = mass > 0
    gaps = np.abs(gap_sum[nonempty] / mass[nonempty])
    share = mass[nonempty] / mass.sum()
    if norm == "l1":
        return float(np.dot(share, gaps))
    if norm == "l2":
        return float(np.sqrt(np.dot(share, gaps**2)))
    if norm == "max":
        return float(gaps.max())
    raise ValueError(f"norm must be 'l1', 'l2' or 'max', not {norm!r}")
