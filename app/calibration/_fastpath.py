"""Shortcuts for the prediction hot path that accept exactly what the full path accepts.

``/calibrate`` validates every batch. For the common case, a float64 array
that is valid as it stands, ``check_scores`` returns the array itself, and
its checks (finite; within [0, 1] for probabilities) reduce to the minimum
and the maximum: NaN propagates through both, and an infinity is one of them.
A short JSON list of numbers is checked without making an array at all (every
numpy call costs microseconds of fixed overhead on a request path, more than
the arithmetic of a small batch). Anything else (other dtypes, shapes,
invalid values) takes the full path, which also finds the offending element
for the error.
"""

from __future__ import annotations

import math

import numpy as np

# The ufunc reductions themselves: ndarray.min and .max call them through a Python wrapper.
_min = np.minimum.reduce
_max = np.maximum.reduce


def quick_scores(scores, input: str, ndim: int = 1, n_columns: int | None = None) -> np.ndarray | None:
    """``scores`` when it is a C-contiguous float64 array of ``ndim`` dimensions (and
    ``n_columns`` columns) that ``check_scores`` would return unchanged; else None.

    Rows of probabilities (``ndim=2, input="probability"``) are never returned here:
    the full path checks their sums and renormalises them.
    """
    return None if quick_extremes(scores, input, ndim, n_columns) is None else scores


def plain_array(scores, input: str, ndim: int = 1, n_columns: int | None = None) -> bool:
    """True if ``scores`` has the form the quick paths take, values not yet looked at: a
    non-empty C-contiguous float64 array of ``ndim`` dimensions; for two, logit rows of
    ``n_columns`` (at least 2) columns."""
    if (
        type(scores) is not np.ndarray
        or scores.dtype != np.float64
        or scores.ndim != ndim
        or not scores.shape[0]
        or not scores.flags.c_contiguous
    ):
        return False
    return ndim == 1 or (input == "logit" and scores.shape[1] == n_columns and n_columns >= 2)


def quick_extremes(scores, input: str, ndim: int = 1, n_columns: int | None = None) -> tuple[float, float] | None:
    """(minimum, maximum) of ``scores`` when ``quick_scores`` would return it; else None."""
    if not plain_array(scores, input, ndim, n_columns):
        return None
    low, high = float(_min(scores, axis=None)), float(_max(scores, axis=None))
    if input == "probability":
        return (low, high) if 0.0 <= low and high <= 1.0 else None
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


#: Lists up to this long are checked by ``quick_list``; longer ones are made arrays first.
LIST_MAX = 256


def quick_list(scores, input: str) -> bool:
    """True if ``scores`` is a short flat list of numbers, the first a float, that
    ``check_scores`` would accept (np.asarray makes float64 of such a list).

    ``sum`` meets every element in C: a string, null or nested list raises
    TypeError, a NaN or an infinity makes the total non-finite (so min and max,
    which would skip a NaN, are only asked afterwards). ``sum`` takes a boolean
    as 0 or 1, so the types are looked at when an element equals 0 or 1.
    """
    if type(scores) is not list or not scores or len(scores) > LIST_MAX or type(scores[0]) is not float:
        return False
    try:
        if not math.isfinite(sum(scores)):
            return False
        if input == "probability":
            low, high = min(scores), max(scores)
            if not (0.0 <= low and high <= 1.0):
                return False
            if 0.0 < low and high < 1.0:  # so no element is a boolean, which would be 0 or 1
                return True
        elif not (1.0 in scores or 0.0 in scores):  # compares equal to True or False
            return True
        return bool not in set(map(type, scores))
    except (TypeError, OverflowError):
        return False

