"""Shortcuts for the prediction hot path that give exactly what the full path gives.

``/calibrate`` validates every batch; for the common case, a float64 array
that is valid as it stands, ``check_scores`` returns the array itself, and
its checks (finite; within [0, 1] for probabilities) reduce to the minimum
and the maximum: NaN propagates through both, and an infinity is one of them.
Anything else (lists, other dtypes, shapes, invalid values) takes the full
path, which also finds the offending element for the error.
"""

from __future__ import annotations

import math

import numpy as np


def quick_scores(scores, input: str, ndim: int = 1, n_columns: int | None = None) -> np.ndarray | None:
    """``scores`` when it is a C-contiguous float64 array of ``ndim`` dimensions (and
    ``n_columns`` columns) that ``check_scores`` would return unchanged; else None.

    Rows of probabilities (``ndim=2, input="probability"``) are never returned here:
    the full path checks their sums and renormalises them.
    """
    if (
        type(scores) is not np.ndarray
        or scores.dtype != np.float64
        or scores.ndim != ndim
        or not scores.shape[0]
        or not scores.flags.c_contiguous
    ):
        return None
    if ndim == 2 and (input != "logit" or scores.shape[1] != n_columns or n_columns < 2):
        return None
    low, high = float(scores.min()), float(scores.max())
    if input == "probability":
        return scores if 0.0 <= low and high <= 1.0 else None
    return scores if math.isfinite(low) and math.isfinite(high) else None
