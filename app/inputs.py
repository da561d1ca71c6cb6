"""Input checking shared by every numeric package: the error type and the array checks.

This module is the ground floor of calibd's pure core: it imports numpy only, and
``calibd.calibration``, ``calibd.metrics`` and ``calibd.monitoring`` all build on it. A
check raises :class:`CalibrationInputError` naming the field (``scores``, ``probabilities``,
``sample_weight``, ``options.n_bins``, ...) and the index of the first offending element,
so that a service can point at it with a JSON pointer (``/scores/3``).
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

__all__ = [
    "CalibrationInputError",
    "CalibrationInputTypeError",
    "NOT_A_BOOLEAN",
    "ROW_SUM_TOLERANCE",
    "as_float_array",
    "boolean_index",
    "check_sample_weight",
    "first_index",
    "may_hold_booleans",
    "refuse_booleans",
]

#: Probability rows may be off by this much from summing to 1 (rounded inputs are common);
#: within it a row is renormalised, further off it is rejected.
ROW_SUM_TOLERANCE = 1e-3

NOT_A_BOOLEAN = "must be a number, not true or false"


class CalibrationInputError(ValueError):
    """Invalid input to a calibrator, a metric or a monitor.

    ``field`` names the offending argument (``"scores"``, ``"labels"``,
    ``"sample_weight"``, ``"options.n_bins"``, or an extra array's name) and
    ``index`` the first offending element (a tuple for 2-D arrays), so that a
    service can point at it.
    """

    def __init__(self, field: str, detail: str, index: tuple[int, ...] | None = None):
        self.field = field
        self.detail = detail
        self.index = index
        where = field + "".join(f"[{i}]" for i in index or ())
        super().__init__(f"{where}: {detail}")


class CalibrationInputTypeError(CalibrationInputError, TypeError):
    """An element that is not a number where numbers are expected (a TypeError too, as
    numpy's conversion raises)."""


def first_index(mask: np.ndarray) -> tuple[int, ...]:
    """The index (a tuple, one entry per dimension) of the first true element of ``mask``."""
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask.ravel())[0]), mask.shape))


def may_hold_booleans(array: np.ndarray) -> bool:
    """False when no element is 0 or 1, the values numpy and ``struct`` make of JSON's
    false and true in a list of numbers: then the list needs no closer look."""
    return bool(np.logical_or(array == 0.0, array == 1.0).any())


def boolean_index(values: list, ndim: int) -> tuple[int, ...] | None:
    """The index of the first ``True`` or ``False`` in a list (``ndim=1``) or a list of rows
    (``ndim=2``), or None. Booleans are not numbers: ``[0.1, true]`` is not a score array.
    The elements' types are gathered in C; only a list that holds a boolean is walked."""
    flat = values if ndim == 1 else chain.from_iterable(values)
    if bool not in set(map(type, flat)):
        return None
    if ndim == 1:
        return (next(i for i, value in enumerate(values) if type(value) is bool),)
    return next((i, j) for i, row in enumerate(values) for j, value in enumerate(row) if type(value) is bool)


def refuse_booleans(values: Any, array: np.ndarray, field: str) -> None:
    """Raise if the list ``values``, made the float ``array``, held a boolean."""
    if isinstance(values, list) and array.size and may_hold_booleans(array):
        where = boolean_index(values, array.ndim)
        if where is not None:
            raise CalibrationInputError(field, NOT_A_BOOLEAN, where)


def as_float_array(values: Any, field: str, ndim: int | tuple[int, ...] = 1) -> np.ndarray:
    """Convert to a finite float64 array of the given number of dimensions.

    ``true`` and ``false`` are refused wherever they are (numpy would read them as 1 and 0).
    """
    try:
        array = np.asarray(values)
    except ValueError:
        raise CalibrationInputError(field, "rows must all have the same length") from None
    if array.dtype.kind == "b" and array.size:
        raise CalibrationInputError(field, NOT_A_BOOLEAN, (0,) * array.ndim)
    if array.dtype.kind not in "fiu":
        raise CalibrationInputError(field, "must contain only numbers")
    array = np.ascontiguousarray(array, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if array.ndim not in allowed:
        shapes = " or ".join({1: "a flat list", 2: "a list of rows"}[d] for d in allowed)
        raise CalibrationInputError(field, f"must be {shapes}")
    refuse_booleans(values, array, field)
    if array.shape[0] == 0:
        raise CalibrationInputError(field, "must not be empty")
    finite = np.isfinite(array)
    if not finite.all():
        raise CalibrationInputError(field, "must be finite (no NaN or infinity)", first_index(~finite))
    return array


def check_sample_weight(
    sample_weight: Any, n_samples: int, field: str = "sample_weight", beside: str = "scores"
) -> np.ndarray:
    """Non-negative finite weights, one per row of ``beside``, with a positive sum; None means all ones."""
    if sample_weight is None:
        return np.ones(n_samples)
    weights = as_float_array(sample_weight, field, ndim=1)
    if weights.shape[0] != n_samples:
        raise CalibrationInputError(field, f"has {weights.shape[0]} entries but {beside} has {n_samples}")
    negative = weights < 0
    if negative.any():
        raise CalibrationInputError(field, "weights must be non-negative", first_index(negative))
    if not weights.sum() > 0:
        raise CalibrationInputError(field, "weights must not all be zero")
    return weights
