"""Isotonic regression: the non-decreasing step function closest to the labels.

    m = argmin_{m_1 <= ... <= m_k}  sum_j W_j (ybar_j - m_j)^2

over the k distinct holdout scores s_1 < ... < s_k, where W_j is the total
weight of the rows tied at s_j and ybar_j their weighted mean label (ties are
pooled first, so tied scores always get one value). The solution is found by
pool-adjacent-violators: each m_j is the weighted mean label of the block of
adjacent scores it was pooled into. Zadrozny & Elkan (2002), "Transforming
classifier scores into accurate multiclass probability estimates"; the
algorithm is from Ayer et al. (1955) and Barlow et al. (1972), "Statistical
inference under order restrictions".

Prediction interpolates linearly between the first and last score of each
block and is clipped to the end values outside [s_1, s_k], exactly as
scikit-learn's ``IsotonicRegression(out_of_bounds="clip")``:

    p'(s) = interp(s, x_thresholds, y_thresholds)

Only those block boundary points are kept (scikit-learn's ``trim_duplicates``),
so the stored state is at most twice the number of blocks. The fit works on
the scores as given (probabilities or logits); the interpolation, and so the
output between blocks, depends on that scale, the block values do not.
Ties are exact float equality (scikit-learn also merges scores closer than
1e-15, which only matters for such denormal-scale differences).

Prediction computes np.interp's own arithmetic, slope_j * (s - x_j) + y_j
with slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j), so it gives the same
floats; only the search for j differs. np.interp binary-searches each score
(about 45 ns a score for a few hundred thresholds on a 2-core server, half of
what /calibrate spends on 10,000 scores); large batches instead look j up in
a uniform grid over [x_1, x_k] (``_GridLookup``), a few vectorised passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

from ._fastpath import quick_scores
from .base import Calibrator, CalibrationInputError


def pool_ties(
    scores: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct scores ascending, with the total weight, positive weight and
    negative weight of the rows tied at each. Zero-weight rows are dropped."""
    if not weights.all():
        # A zero-weight row must not create a distinct score (scikit-learn drops them too).
        keep = weights > 0
        scores, labels, weights = scores[keep], labels[keep], weights[keep]
    if scores.shape[0] == 0:
        raise CalibrationInputError("sample_weight", "weights must not all be zero")
    order = np.argsort(scores)
    sorted_scores, w = scores[order], weights[order]
    y = labels[order].astype(np.float64)
    starts = np.flatnonzero(np.concatenate(([True], sorted_scores[1:] != sorted_scores[:-1])))
    total = np.add.reduceat(w, starts)
    positive = np.add.reduceat(w * y, starts)
    negative = np.add.reduceat(w * (1.0 - y), starts)
    return sorted_scores[starts], total, positive, negative


def _interp_by_ratio(scores: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """np.interp as y0 + t (y1 - y0), t = (s - x0) / (x1 - x0) in [0, 1]: no overflow."""
    i = np.clip(np.searchsorted(x, scores, side="right") - 1, 0, x.shape[0] - 2)
    x0, x1, y0, y1 = x[i], x[i + 1], y[i], y[i + 1]
    t = np.clip((scores - x0) / (x1 - x0), 0.0, 1.0)
    return np.clip(y0 + t * (y1 - y0), y0, y1)


#: Below this many scores np.interp's binary search is cheaper than the grid's fixed cost.
_GRID_MIN_BATCH = 256
#: Grid cells per threshold, and the most vectorised passes before crowded cells are searched instead.
_CELLS_PER_THRESHOLD = 4
_MAX_PASSES = 3


class _GridLookup:
    """np.interp(s, x, y) for many s at once, with the segment found through a uniform grid.

    The grid cuts [x_1, x_k] into G equal cells; cell(v) = floor((v - x_1) * G / span)
    is computed by the same float operations for thresholds and scores, and is
    monotone in v (rounding never reverses order), so every threshold in an
    earlier cell is <= s and every one in a later cell is > s. The segment of s,
    j = #{i: x_i <= s} - 1, is therefore base[cell] (the thresholds before the
    cell, minus one) plus a comparison with each threshold inside the cell:
    exact, whatever the rounding. With about 4 cells per threshold most cells
    hold at most one threshold; scores in cells with more than _MAX_PASSES are
    binary-searched instead.
    """

    __slots__ = ("x", "y", "x_first", "x_last", "scale", "base", "padded", "slopes", "passes", "crowded")

    @classmethod
    def build(cls, x: np.ndarray, y: np.ndarray) -> _GridLookup | None:
        k = x.shape[0]
        if k < 2:
            return None
        span = float(x[-1] - x[0])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            slopes = np.append((y[1:] - y[:-1]) / (x[1:] - x[:-1]), 0.0)
        # Overflowing spans or slopes (subnormal-close knots) keep np.interp and its repair.
        if not (np.isfinite(span) and span > 0 and np.isfinite(slopes).all()):
            return None
        self = cls()
        cells = int(min(max(_CELLS_PER_THRESHOLD * k, 64), 1 << 22))
        self.scale = cells / span
        self.x, self.y, self.slopes = x, y, slopes
        self.x_first, self.x_last = float(x[0]), float(x[-1])
        cell = ((x - self.x_first) * self.scale).astype(np.intp)
        counts = np.bincount(cell, minlength=int(cell[-1]) + 1)
        index_type = np.int32 if k < 2**31 - 64 else np.intp
        self.base = (np.cumsum(counts) - counts - 1).astype(index_type)
        most = int(counts.max())
        self.passes = min(most, _MAX_PASSES)
        # Comparisons past the cell's own thresholds meet later thresholds (> s) or +inf.
        self.padded = np.append(x, np.full(self.passes, np.inf))
        self.crowded = counts > _MAX_PASSES if most > _MAX_PASSES else None
        return self

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        s = np.clip(scores, self.x_first, self.x_last)
        offset = s - self.x_first
        offset *= self.scale
        cell = offset.astype(np.intp)
        base = self.base[cell]
        j = base.copy()
        for step in range(1, self.passes + 1):
            j += self.padded[base + step] <= s
        if self.crowded is not None:
            crowded = self.crowded[cell]
            if crowded.any():
                j[crowded] = np.searchsorted(self.x, s[crowded], side="right") - 1
        # np.interp's arithmetic: slope_j (s - x_j) + y_j; the last threshold has slope 0.
        p = s - self.x[j]
        p *= self.slopes[j]
        p += self.y[j]
        return p

    @property
    def nbytes(self) -> int:
        extra = 0 if self.crowded is None else self.crowded.nbytes
        return self.base.nbytes + self.padded.nbytes + self.slopes.nbytes + extra


class IsotonicCalibrator(Calibrator):
    """Isotonic regression, interpolated between block boundaries."""

    method = "isotonic"
    monotone = True
    fitted_attributes = ("x_thresholds_", "y_thresholds_")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        x, total, positive, _ = pool_ties(scores, labels, weights)
        # PAV in compiled code (SciPy >= 1.12); it merges adjacent equal blocks too.
        fitted = isotonic_regression(positive / total, weights=total).x
        # Keep the first and last point of every run of equal values: interior
        # points of a flat run add nothing to a linear interpolation.
        keep = np.ones(fitted.shape[0], dtype=bool)
        keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
        self.x_thresholds_ = x[keep]
        # Block means of 0/1 labels lie in [0, 1]; the clip only undoes rounding.
        self.y_thresholds_ = np.clip(fitted[keep], 0.0, 1.0)

    def check_predict_scores(self, scores):
        # The hot path: a valid float64 array is returned as it is, as the full check would.
        if getattr(self, "n_classes_", 2) == 2 and hasattr(self, "y_thresholds_"):
            quick = quick_scores(scores, self.input)
            if quick is not None:
                return quick
        return super().check_predict_scores(scores)

    def prepare(self) -> None:
        """Build the lookup grid now (the calibrator cache calls this before sizing an entry)."""
        self._lookup()

    def _lookup(self) -> _GridLookup | None:
        x, y = self.x_thresholds_, self.y_thresholds_
        cached = getattr(self, "_grid", None)
        if cached is None or cached[0] is not x or cached[1] is not y:
            cached = (x, y, _GridLookup.build(x, y))
            self._grid = cached
        return cached[2]

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        x, y = self.x_thresholds_, self.y_thresholds_
        if scores.shape[0] >= _GRID_MIN_BATCH:
            lookup = self._lookup()
            if lookup is not None:
                return lookup(scores)
        # np.interp holds the end values outside the fitted range (the "clip").
        p = np.interp(scores, x, y)
        # It divides by the knot spacing first, which overflows when two knots
        # are subnormal-close (scores within ~1e-300 of 0): redo those rows.
        bad = ~np.isfinite(p)
        if bad.any():
            p[bad] = _interp_by_ratio(scores[bad], x, y)
        return p

    def fit_info(self) -> dict[str, Any]:
        x, y = self.x_thresholds_, self.y_thresholds_
        return {
            "n_blocks": int(1 + np.count_nonzero(y[1:] != y[:-1])),
            "n_thresholds": int(x.shape[0]),
            "score_range": [float(x[0]), float(x[-1])],
            "output_range": [float(y[0]), float(y[-1])],
        }
