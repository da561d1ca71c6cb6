"""Compiled kernels for the temperature softmax and the isotonic lookup, numpy the fallback.

The kernels (``_kernels.c``, built by ``pip install`` where a C compiler is
found) read plain valid scores, a JSON list of floats as orjson parsed it or a
C-contiguous float64 array, and answer in one pass: no float64 array made of
the list first, no chain of numpy calls each with its fixed cost. Anything
else (an int, a boolean, a NaN, a ragged row, another dtype) makes them return
None, and the caller takes its numpy path, which validates the scores and
names the bad element.

The isotonic lookup is the numpy path's arithmetic to the bit. The softmax
uses the C library's ``exp``, which differs from numpy's vectorised one in
the last bit for a few percent of values: with the kernels built, every
temperature prediction (``/calibrate``, the batch path, the estimator) goes
through the kernel, so the answers agree with each other to the bit.
``tests/test_kernels.py`` compares both paths.

``CALIBD_KERNELS=0`` turns the kernels off (read at import).
"""

from __future__ import annotations

import os
import sys

import numpy as np

try:
    from . import _kernels as _compiled
except ImportError:  # built without a C compiler: the numpy path serves
    _compiled = None

if os.environ.get("CALIBD_KERNELS", "1") == "0":
    _compiled = None

#: The largest finite double: a logit-scale score's bounds (NaN and the infinities fall outside).
_FINITE = (-sys.float_info.max, sys.float_info.max)


def available() -> bool:
    """Whether the compiled kernels are built and on."""
    return _compiled is not None


def _plain(scores: object) -> object:
    """A list as it is; a float array as an aligned C-contiguous float64 one (a copy only when it is
    not one already: a view, float32, or a tensor's bytes at an odd offset), which the kernels read
    in place; None for anything else."""
    if type(scores) is list:
        return scores if scores else None
    if type(scores) is np.ndarray and scores.dtype.kind == "f" and scores.ndim and scores.shape[0]:
        return np.require(scores, np.float64, ("C", "A"))
    return None


def softmax(scores: object, temperature: float, k: int) -> np.ndarray | None:
    """softmax(z / T) of each row of ``k`` logits, rows within |z / T| < 600 unshifted and the
    others shifted by their maximum (``temperature._softmax_in_place``); None when the kernels
    are off or ``scores`` are not rows of ``k`` finite floats."""
    if _compiled is None or (scores := _plain(scores)) is None:
        return None
    out = np.empty((len(scores), k))
    return out if _compiled.softmax(scores, temperature, k, out) else None


class IsotonicLookup:
    """np.interp(s, x, y) with the ends held, compiled: the segment of s from a uniform grid
    over the thresholds, then (s - x_j) slope_j + y_j, np.interp's arithmetic.

    The grid is isotonic.py's (``_GridLookup``): cell(v) = floor((v - x_1) scale), computed by the
    same operations for thresholds and scores, so it is monotone in v; every threshold in an
    earlier cell is <= s, every one in a later cell > s, and a search among the thresholds of
    s's own cell (after ``base[cell]``, the last threshold before it) is exact whatever the
    rounding. Made only when ``available()``, for finite ``slopes`` (0 after the last threshold).
    """

    __slots__ = ("x", "y", "slopes", "base", "scale")

    def __init__(self, x: np.ndarray, y: np.ndarray, slopes: np.ndarray, scale: float, base: np.ndarray):
        self.x, self.y = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(y, np.float64)
        self.slopes = np.ascontiguousarray(slopes, np.float64)
        self.scale, self.base = scale, np.ascontiguousarray(base, np.int64)

    def __call__(self, scores: object, bounds: tuple[float, float] = _FINITE) -> np.ndarray | None:
        """The lookup of every score, if all are floats within ``bounds`` (a list, or a 1-D
        C-contiguous float64 array); else None."""
        if (scores := _plain(scores)) is None:
            return None
        out = np.empty(len(scores))
        low, high = bounds
        done = _compiled.isotonic(scores, self.x, self.y, self.slopes, self.base, self.scale, low, high, out)
        return out if done else None

    @property
    def nbytes(self) -> int:
        return self.base.nbytes


def score_bounds(input: str) -> tuple[float, float]:
    """The values a score may take: [0, 1] for probabilities, any finite float for logits."""
    return (0.0, 1.0) if input == "probability" else _FINITE
