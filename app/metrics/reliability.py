"""Reliability-diagram data: per bin the edges, count, mean prediction, observed frequency and a Wilson interval.

Bins are the ECE's (:mod:`calibd.metrics.binned`: ``uniform`` or ``quantile``,
left-closed [lower, upper), the last one closed so that 1.0 falls in it).
Every bin is listed, empty ones with ``count`` 0 and nulls, so a diagram has
a fixed set of bars. For bin b:

* ``mean_prediction`` = sum w p / sum w, ``observed_frequency`` = sum w y / sum w;
* ``wilson``: the Wilson (1927) score interval for the frequency at ``level``
  (z = Phi^-1((1 + level) / 2)), with n the bin's count:

      centre = (f + z^2 / 2n) / (1 + z^2 / n)
      half   = z sqrt(f (1 - f) / n + z^2 / 4n^2) / (1 + z^2 / n)

  With sample weights, n is the effective count n_eff = (sum w)^2 / sum w^2
  (Kish), which is the count for unit weights and shrinks as weights become
  uneven; the bins then also report ``weight`` (sum w) and ``effective_count``.

The frequencies and mean predictions agree with scikit-learn's
``calibration_curve`` bin for bin (it drops empty bins, and its bins are
right-closed: a prediction exactly on an interior edge goes one bin lower there).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import ndtri

from .binned import BINNINGS, DEFAULT_N_BINS, bin_index, check_choice, check_n_bins
from .inputs import Prepared, binary_problems, input_error, prepare, resolve_target

DEFAULT_LEVEL = 0.95


def check_level(level: Any, field: str = "options.level") -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise input_error(field, "must be a number strictly between 0 and 1")
    return float(level)


def wilson_interval(frequency: np.ndarray, count: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval(s) for a proportion ``frequency`` observed over ``count`` (> 0) trials."""
    z = float(ndtri(0.5 + level / 2.0))
    f = np.asarray(frequency, dtype=np.float64)
    n = np.asarray(count, dtype=np.float64)
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (f + z2 / (2.0 * n)) / denominator
    half = z * np.sqrt(np.maximum(f * (1.0 - f), 0.0) / n + z2 / (4.0 * n * n)) / denominator
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def _bins(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, n_bins: int, binning: str, level: float) -> list[dict]:
    edges, bins = bin_index(p, n_bins, binning)
    count = np.bincount(bins, minlength=n_bins)
    if w is None:
        mass = count.astype(np.float64)
        n_eff = mass
        sum_p = np.bincount(bins, weights=p, minlength=n_bins)
        sum_y = np.bincount(bins, weights=y, minlength=n_bins)
    else:
        mass = np.bincount(bins, weights=w, minlength=n_bins)
        squares = np.bincount(bins, weights=w * w, minlength=n_bins)
        n_eff = np.divide(mass**2, squares, out=np.zeros(n_bins), where=squares > 0)
        sum_p = np.bincount(bins, weights=w * p, minlength=n_bins)
        sum_y = np.bincount(bins, weights=w * y, minlength=n_bins)
    nonempty = mass > 0
    safe = np.where(nonempty, mass, 1.0)
    mean_p = sum_p / safe
    freq = sum_y / safe
    low, high = wilson_interval(freq, np.where(nonempty, n_eff, 1.0), level)
    out = []
    for b in range(n_bins):
        entry: dict[str, Any] = {"lower": float(edges[b]), "upper": float(edges[b + 1]), "count": int(count[b])}
        if w is not None:
            entry["weight"] = float(mass[b])
            entry["effective_count"] = float(n_eff[b])
        if nonempty[b]:
            entry.update(
                mean_prediction=float(mean_p[b]),
                observed_frequency=float(freq[b]),
                wilson=[float(low[b]), float(high[b])],
            )
        else:
            entry.update(mean_prediction=None, observed_frequency=None, wilson=None)
        out.append(entry)
    return out


def reliability_diagram(
    probabilities,
    labels,
    n_bins: int = DEFAULT_N_BINS,
    binning: str = "uniform",
    sample_weight=None,
    target: str | None = None,
    level: float = DEFAULT_LEVEL,
) -> dict[str, Any]:
    """``{"target", "binning", "n_bins", "level", "bins": [...]}``; classwise gives ``"classes": [{"class", "bins"}]``."""
    data = prepare(probabilities, labels, sample_weight)
    n_bins = check_n_bins(n_bins)
    check_choice(binning, BINNINGS, "options.binning")
    target = resolve_target(data, target)
    return reliability_prepared(data, n_bins, binning, target, check_level(level))


def reliability_prepared(data: Prepared, n_bins: int, binning: str, target: str, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    head: dict[str, Any] = {"target": target, "binning": binning, "n_bins": n_bins, "level": level}
    problems = binary_problems(data, target)
    if target == "classwise":
        head["classes"] = [
            {"class": k, "bins": _bins(p, y, data.w, n_bins, binning, level)} for k, (p, y) in enumerate(problems)
        ]
        return head
    ((p, y),) = problems
    head["bins"] = _bins(p, y, data.w, n_bins, binning, level)
    return head
