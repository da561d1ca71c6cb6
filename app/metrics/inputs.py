"""Validation of metric inputs, and the binary problems a target reduces to.

Every public metric validates its arrays here, at the boundary, in O(n)
numpy, and raises :class:`calibd.inputs.CalibrationInputError` with the
field (``probabilities``, ``labels``, ``sample_weight``, ``options.<name>``)
and the index of the first offending element, so that a service can point at
it (``/probabilities/3/1``).

Shapes:

* binary: ``probabilities`` is ``(n,)``, the probability of class 1, and
  ``labels`` are 0/1;
* multiclass: ``probabilities`` is ``(n, K)``, K >= 2, rows summing to 1, and
  ``labels`` are ints ``0..K-1``. A row whose sum is within ``ROW_SUM_TOLERANCE`` of
  1 is renormalised to sum to 1 exactly; a row further off is rejected.

A *target* turns the input into one or more binary problems (prediction,
0/1 outcome), on which every binned and unbinned estimator is defined:

* ``binary``: the probability of class 1 against the label (flat input, or
  column 1 of a two-column input);
* ``top_label``: the largest probability of each row (the confidence) against
  whether its arg-max class, the first one on ties, is the label (Guo et al.
  2017, "confidence calibration"); for flat input the rows are (1 - p, p);
* ``classwise``: one problem per class k, column k against ``label == k``
  (Kull et al. 2019); for flat input the classes are (1 - p, p).

Sample weights: every metric is unchanged when all weights are scaled by one
factor, and unit weights give the unweighted value. Means (bin frequencies,
mean predictions, partial sums) are weighted means, so integer weights act as
repeated rows there; where a method needs a sample size for a variance
(the debiased estimator, Spiegelhalter's Z, Wilson intervals), weights are
fixed importance weights and the size is Kish's effective count
(sum w)^2 / sum w^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import inputs
from ..inputs import ROW_SUM_TOLERANCE, CalibrationInputError, first_index, refuse_booleans

# The metrics' own name for the shared error, kept for their many raise sites.
input_error = CalibrationInputError

__all__ = [
    "input_error",
    "Prepared",
    "ROW_SUM_TOLERANCE",
    "TARGETS",
    "binary_problems",
    "check_labels",
    "check_probabilities",
    "check_sample_weight",
    "prepare",
    "resolve_target",
]

TARGETS = ("binary", "top_label", "classwise")


def _locate_non_number(values: Any, field: str) -> Exception:
    """Point at the first element of a (nested) list that is not a number or has the wrong length."""
    if isinstance(values, (list, tuple)):
        row_length = None
        for i, item in enumerate(values):
            if isinstance(item, (list, tuple)):
                if row_length is None:
                    row_length = len(item)
                elif len(item) != row_length:
                    return input_error(field, f"rows must all have the same length ({row_length})", (i,))
                for j, x in enumerate(item):
                    if isinstance(x, bool) or not isinstance(x, (int, float)):
                        return input_error(field, "must be a number", (i, j))
            elif row_length is not None:
                return input_error(field, f"must be a row of {row_length} numbers", (i,))
            elif isinstance(item, bool) or not isinstance(item, (int, float)):
                if i > 0 and isinstance(values[0], (list, tuple)):
                    return input_error(field, "must be a row of numbers", (i,))
                return input_error(field, "must be a number", (i,))
    return input_error(field, "must contain only numbers")


def _as_array(values: Any, field: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        array = values
    else:
        if not isinstance(values, (list, tuple)):
            raise input_error(field, "must be a list")
        try:
            array = np.asarray(values)
        except (ValueError, TypeError):
            raise _locate_non_number(values, field) from None
    if array.dtype.kind == "b":
        raise input_error(field, "must contain numbers, not booleans")
    if array.dtype.kind not in "fiu":
        raise _locate_non_number(values, field)
    if array.ndim == 0 or array.shape[0] == 0:
        raise input_error(field, "must not be empty")
    if array.ndim <= 2:
        refuse_booleans(values, array, field)
    return array


def check_probabilities(probabilities: Any, field: str = "probabilities") -> np.ndarray:
    """A float64 ``(n,)`` array in [0, 1], or an ``(n, K)`` array of rows summing to 1 (renormalised)."""
    array = _as_array(probabilities, field)
    if array.ndim not in (1, 2):
        raise input_error(field, "must be a flat list (binary) or a list of rows (multiclass)")
    p = np.ascontiguousarray(array, dtype=np.float64)
    if p.ndim == 2 and p.shape[1] < 2:
        raise input_error(field, "rows need one probability per class (at least 2); send a flat list for binary")
    if not (p.min() >= 0.0 and p.max() <= 1.0):  # also false for NaN, which min and max propagate
        finite = np.isfinite(p)
        if not finite.all():
            raise input_error(field, "must be finite (no NaN or infinity)", first_index(~finite))
        outside = (p < 0.0) | (p > 1.0)
        raise input_error(field, "probabilities must lie in [0, 1]", first_index(outside))
    if p.ndim == 2:
        sums = p.sum(axis=1)
        off = np.abs(sums - 1.0) > ROW_SUM_TOLERANCE
        if off.any():
            i = int(np.flatnonzero(off)[0])
            raise input_error(field, f"row sums to {sums[i]:.6g}, not 1 (tolerance {ROW_SUM_TOLERANCE})", (i,))
        if (sums != 1.0).any():
            p = p / sums[:, None]
    return p


def check_labels(labels: Any, n_samples: int, n_classes: int, field: str = "labels") -> np.ndarray:
    """Integer labels ``0..n_classes-1`` (integral floats accepted): int8 for binary, intp otherwise."""
    array = _as_array(labels, field)
    if array.ndim != 1:
        raise input_error(field, "must be a flat list of class indices")
    if array.shape[0] != n_samples:
        raise input_error(field, f"has {array.shape[0]} entries but probabilities has {n_samples}")
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.floor(array))
        if bad.any():
            raise input_error(field, "labels must be integers", first_index(bad))
    low, high = array.min(), array.max()
    if low < 0 or high > n_classes - 1:
        bad = (array < 0) | (array > n_classes - 1)
        allowed = "0 or 1" if n_classes == 2 else f"integers 0..{n_classes - 1}"
        raise input_error(field, f"labels must be {allowed}", first_index(bad))
    return array.astype(np.int8 if n_classes == 2 else np.intp, copy=False)


def check_sample_weight(sample_weight: Any, n_samples: int, field: str = "sample_weight") -> np.ndarray | None:
    """Non-negative finite weights with a positive sum; None stays None (all ones)."""
    if sample_weight is None:
        return None
    return inputs.check_sample_weight(_as_array(sample_weight, field), n_samples, field, beside="probabilities")


@dataclass(frozen=True)
class Prepared:
    """Validated inputs: ``p`` is ``(n,)`` (binary) or ``(n, K)``; ``w`` is None for unit weights."""

    p: np.ndarray
    y: np.ndarray
    w: np.ndarray | None

    @property
    def binary(self) -> bool:
        return self.p.ndim == 1

    @property
    def n_classes(self) -> int:
        return 2 if self.p.ndim == 1 else int(self.p.shape[1])

    @property
    def n(self) -> int:
        return int(self.p.shape[0])

    def take(self, index: np.ndarray) -> Prepared:
        """The rows at ``index`` (a bootstrap resample)."""
        return Prepared(self.p[index], self.y[index], None if self.w is None else self.w[index])


def prepare(probabilities: Any, labels: Any, sample_weight: Any = None) -> Prepared:
    """Validate all three arrays (already-validated ``Prepared`` passes through)."""
    if isinstance(probabilities, Prepared):
        return probabilities
    p = check_probabilities(probabilities)
    n_classes = 2 if p.ndim == 1 else p.shape[1]
    y = check_labels(labels, p.shape[0], n_classes)
    w = check_sample_weight(sample_weight, p.shape[0])
    return Prepared(p, y, w)


def resolve_target(data: Prepared, target: str | None, field: str = "options.target") -> str:
    """``None`` means ``binary`` for flat input and ``top_label`` for rows."""
    if target is None:
        return "binary" if data.binary else "top_label"
    if target not in TARGETS:
        raise input_error(field, f"must be one of {', '.join(TARGETS)}, or null")
    if target == "binary" and not data.binary and data.n_classes != 2:
        raise input_error(field, "'binary' needs a flat list or two columns; use top_label or classwise")
    return target


def binary_problems(data: Prepared, target: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (prediction, 0/1 outcome) pairs that ``target`` reduces the input to (see the module docstring)."""
    p, y = data.p, data.y
    if target == "binary":
        if data.binary:
            return [(p, y)]
        return [(np.ascontiguousarray(p[:, 1]), (y == 1).astype(np.int8))]
    if target == "top_label":
        if data.binary:
            predicted = (p > 0.5).astype(np.int8)  # argmax of (1 - p, p), class 0 on the tie at 0.5
            return [(np.maximum(p, 1.0 - p), (predicted == y).astype(np.int8))]
        predicted = p.argmax(axis=1)
        return [(p[np.arange(p.shape[0]), predicted], (predicted == y).astype(np.int8))]
    if target == "classwise":
        if data.binary:
            return [(1.0 - p, (1 - y).astype(np.int8)), (p, y)]
        return [(np.ascontiguousarray(p[:, k]), (y == k).astype(np.int8)) for k in range(p.shape[1])]
    raise input_error("options.target", f"must be one of {', '.join(TARGETS)}, or null")
