"""Calibration statistics without bins: interval calibration, KS error, Spiegelhalter's Z.

All three work on the predictions sorted ascending, through the partial sums

    S_k = sum_{i <= k} w_i (y_i - p_i)          (S_0 = 0)

taken only at the ends of runs of equal p (so tied predictions are never
split and the result does not depend on the order of ties), divided by the
total weight W (n for unit weights).

* ``interval_calibration`` (papers/003, "empirical calibration"):
  sup over intervals (a, b] of |(1/n) sum_i (y_i - p_i) 1[a < p_i <= b]|
  = (max_k S_k - min_k S_k) / n. Isotonic regression (PAV) fitted on the
  same rows makes it exactly 0 (papers/003, Claim 5).
* ``ks_error`` (Gupta et al. 2021, "Calibration of neural networks using
  splines"): max_k |S_k| / n, the largest gap between the cumulative sums of
  outcomes and of predictions; ks <= interval_calibration <= 2 ks.
* ``spiegelhalter`` (Spiegelhalter 1986, "Probabilistic prediction in patient
  management and clinical trials"):
  Z = sum_i w_i (y_i - p_i)(1 - 2 p_i) / sqrt(sum_i w_i^2 (1 - 2 p_i)^2 p_i (1 - p_i)),
  standard normal under calibration; two-sided p-value = erfc(|Z| / sqrt 2).
  Z is NaN when numerator and variance are both 0 (all p in {0, 1/2, 1}
  and consistent with the labels), and +-inf with p-value 0 when only the
  variance is 0.

Run sums are formed exactly where possible (unit weights: integer label
counts and one product c p per run). A run of c >= 2 tied predictions whose
difference sum(y) - c p is within the floating-point error bound of its
terms, 4 eps (c + 1)(|sum y| + c p), counts as 0: a prediction that equals
its run's label mean up to rounding, as PAV's block means do, contributes
nothing, so isotonic regression in-sample gives exactly 0 rather than 1e-17.
(A single prediction's y - p is computed directly.)

Cost: one sort. For unit weights the 0/1 label is packed into the lowest bit
of the prediction's bit pattern shifted left by one (non-negative doubles
order as their bit patterns; -0.0 becomes +0.0), so a single ``np.sort`` of
uint64 keys orders predictions and carries the labels, and without ties the
rest is a handful of passes; with weights an ``argsort`` is used.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erfc

from .inputs import Prepared, binary_problems, input_error, prepare, resolve_target

_EPS = np.finfo(np.float64).eps


def run_sums(p: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, float]:
    """Partial sums S at the ends of runs of equal p (sorted ascending), and the total weight."""
    n = p.shape[0]
    if w is None:
        key = np.left_shift(p.view(np.uint64), np.uint64(1))
        np.bitwise_or(key, y.astype(np.uint8, copy=False), out=key)
        key.sort()
        ps = np.right_shift(key, np.uint64(1)).view(np.float64)
        distinct = ps[1:] != ps[:-1]
        if distinct.all():  # no ties: every run is one prediction, y - p is exact enough as is
            residual = np.subtract(np.bitwise_and(key, np.uint64(1), out=key), ps, out=ps)  # y - p, in place
            return np.cumsum(residual, out=residual), float(n)
        ends = np.append(np.flatnonzero(distinct), n - 1)
        labels_before = np.cumsum(key & np.uint64(1), dtype=np.int64)
        positives = np.diff(labels_before[ends], prepend=0).astype(np.float64)
        counts = np.diff(ends, prepend=-1).astype(np.float64)
        total = float(n)
    else:
        order = np.argsort(p)
        ps = p[order]
        ws = w[order]
        starts = np.flatnonzero(np.concatenate(([True], ps[1:] != ps[:-1])))
        ends = np.append(starts[1:] - 1, n - 1)
        positives = np.add.reduceat(ws * y[order], starts)
        counts = np.add.reduceat(ws, starts)
        total = float(w.sum())
    values = ps[ends]
    expected = counts * values
    diff = positives - expected
    run_length = np.diff(ends, prepend=-1)
    tolerance = 4.0 * _EPS * (run_length + 1) * (np.abs(positives) + expected)
    diff[(run_length > 1) & (np.abs(diff) <= tolerance)] = 0.0
    return np.cumsum(diff), total


def problem_sums(data: Prepared, target: str) -> list[tuple[np.ndarray, float]]:
    """``run_sums`` of each binary problem of the target."""
    return [run_sums(p, y, data.w) for p, y in binary_problems(data, target)]


def interval_from_sums(sums: list[tuple[np.ndarray, float]]) -> float:
    return float(np.mean([(max(s.max(), 0.0) - min(s.min(), 0.0)) / total for s, total in sums]))


def ks_from_sums(sums: list[tuple[np.ndarray, float]]) -> float:
    return float(np.mean([np.abs(s).max() / total for s, total in sums]))


def interval_calibration(probabilities, labels, sample_weight=None, target: str | None = None) -> float:
    """sup over intervals (a, b] of |mean of (y - p) 1[a < p <= b]| (papers/003); mean over classes for classwise."""
    data = prepare(probabilities, labels, sample_weight)
    return interval_from_sums(problem_sums(data, resolve_target(data, target)))


def ks_error(probabilities, labels, sample_weight=None, target: str | None = None) -> float:
    """Kolmogorov-Smirnov calibration error (Gupta et al. 2021); mean over classes for classwise."""
    data = prepare(probabilities, labels, sample_weight)
    return ks_from_sums(problem_sums(data, resolve_target(data, target)))


def spiegelhalter(probabilities, labels, sample_weight=None, target: str | None = None) -> tuple[float, float]:
    """Spiegelhalter's Z and its two-sided p-value; ``binary`` or ``top_label`` targets only."""
    data = prepare(probabilities, labels, sample_weight)
    return spiegelhalter_prepared(data, resolve_target(data, target))


def spiegelhalter_prepared(data: Prepared, target: str) -> tuple[float, float]:
    if target == "classwise":
        raise input_error("options.target", "spiegelhalter_z is defined for the binary and top_label targets")
    ((p, y),) = binary_problems(data, target)
    a = 1.0 - 2.0 * p
    if data.w is None:
        numerator = float(np.dot(y - p, a))
        variance = float(np.dot(a * a, p * (1.0 - p)))
    else:
        w = data.w
        numerator = float(np.dot(w * (y - p), a))
        variance = float(np.dot(w * w * a * a, p * (1.0 - p)))
    if variance > 0:
        z = numerator / np.sqrt(variance)
    elif numerator == 0:
        return float("nan"), float("nan")
    else:
        z = float(np.copysign(np.inf, numerator))
    return float(z), float(erfc(abs(z) / np.sqrt(2.0)))
