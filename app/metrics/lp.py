"""The l_p calibration error of Bairaktari & Nguyen, "Sample-efficient multiclass calibration under l_p error" (papers/001).

The prediction vectors f(x) in the simplex are binned by rounding every
coordinate down to a multiple of 1/lambda, R(u)_j = floor(lambda u_j) / lambda;
the bins are the distinct rounded vectors actually seen (found with
``np.unique`` on the rows of integers floor(lambda f), a hash of the vector).
For bin v and class j, with y the one-hot label,

    Err(v, j) = | (1/W) sum_i w_i (f(x_i)_j - y_ij) 1[R(f(x_i)) = v] |

(the bin's mass sits inside the absolute value: Definition 5 of the paper),
and

    Err_p = ( sum_{v, j} Err(v, j)^p )^(1/p),    Err_inf = max_{v, j} Err(v, j).

p = 1 is a multiclass (canonical) ECE over the rounded bins; p = inf is the
error notion of Hébert-Johnson et al. / Błasiok et al. A bin of mass m adds
at most m per class, which is what keeps the estimate testable for p > 1.
Binary input (n,) is the two-class vector (1 - p, p).

Defaults: p = 2, lambda = 10 (coordinates rounded to tenths). R uses float64
arithmetic: floor(lambda * u) as numpy computes it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .inputs import Prepared, input_error, prepare

DEFAULT_LAMBDA = 10
MAX_LAMBDA = 1_000_000


def check_lambda(lam: Any, field: str = "options.lambda") -> int:
    if isinstance(lam, bool) or not isinstance(lam, (int, np.integer)) or not 1 <= lam <= MAX_LAMBDA:
        raise input_error(field, f"must be an integer from 1 to {MAX_LAMBDA} (coordinates are rounded to multiples of 1/lambda)")
    return int(lam)


def check_order(p: Any, field: str = "p") -> float:
    if isinstance(p, str) and p.lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not (p >= 1):
        raise input_error(field, "must be a number >= 1 or 'inf'")
    return float(p)


def round_codes(f: np.ndarray, lam: int) -> np.ndarray:
    """The integer rows floor(lambda f) of R(f) = floor(lambda f) / lambda, shape (n, K)."""
    return np.floor(lam * f).astype(np.int64)


def bin_ids(codes: np.ndarray, lam: int) -> np.ndarray:
    """A bin number per row of ``round_codes`` output: rows with equal codes share one, 0..bins-1."""
    n_classes = codes.shape[1]
    if (lam + 1) ** n_classes < 2**62:
        # A mixed-radix number identifies the rounded vector exactly.
        radix = (lam + 1) ** np.arange(n_classes, dtype=np.int64)
        _, inverse = np.unique(codes @ radix, return_inverse=True)
    else:
        _, inverse = np.unique(codes, axis=0, return_inverse=True)
    return inverse.ravel()


def lp_cells(data: Prepared, lam: int) -> np.ndarray:
    """Err(v, j) for every observed bin v and class j, shape (bins, K)."""
    if data.binary:
        f = np.column_stack((1.0 - data.p, data.p))
    else:
        f = data.p
    n, k = f.shape
    bins = bin_ids(round_codes(f, lam), lam)
    n_bins = int(bins.max()) + 1
    residual = f.copy()
    label = data.y.astype(np.intp)
    residual[np.arange(n), label] -= 1.0
    if data.w is None:
        total = float(n)
    else:
        residual *= data.w[:, None]
        total = float(data.w.sum())
    cells = np.bincount(
        (bins[:, None] * k + np.arange(k)).ravel(), weights=residual.ravel(), minlength=n_bins * k
    ).reshape(n_bins, k)
    return np.abs(cells) / total


def lp_error(probabilities, labels, p: float | str = 2, lam: int = DEFAULT_LAMBDA, sample_weight=None) -> float:
    """Err_p of papers/001 with rounding 1/lambda; see the module docstring."""
    data = prepare(probabilities, labels, sample_weight)
    return lp_prepared(data, check_order(p), check_lambda(lam))


def lp_from_cells(cells: np.ndarray, order: float) -> float:
    if math.isinf(order):
        return float(cells.max())
    if order == 1:
        return float(cells.sum())
    if order == 2:
        return float(np.sqrt(np.sum(cells * cells)))
    return float(np.sum(cells**order) ** (1.0 / order))


def lp_prepared(data: Prepared, order: float, lam: int) -> float:
    return lp_from_cells(lp_cells(data, lam), order)
