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
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

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

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        x, y = self.x_thresholds_, self.y_thresholds_
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
