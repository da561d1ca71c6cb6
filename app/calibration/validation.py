"""The validation toolkit of calibrators: scores, labels, holdouts, extra arrays, learned state.

Everything is checked at the boundary, in O(n) numpy, and a failure raises
:class:`calibd.inputs.CalibrationInputError` naming the field and the first offending element.
The checks shared with the metrics (finite float arrays, booleans, sample weights) live in
:mod:`calibd.inputs`, below both packages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from ..inputs import (
    ROW_SUM_TOLERANCE,
    CalibrationInputError,
    CalibrationInputTypeError,
    as_float_array,
    first_index,
    refuse_booleans,
)
from .columns import check_columns


def check_scores(
    scores: Any, input: str, tasks: tuple[str, ...] = ("binary",), n_columns: int | None = None, field: str = "scores"
) -> np.ndarray:
    """Validate scores: a flat array (binary) or rows of K columns (multiclass, multivariate).

    Probability rows of a multiclass calibrator must sum to 1 within
    ROW_SUM_TOLERANCE and come back renormalised.
    """
    dims = tuple(sorted({1 if task == "binary" else 2 for task in tasks}))
    scores = as_float_array(scores, field, ndim=dims)
    if scores.ndim == 2:
        if scores.shape[1] < 2:
            raise CalibrationInputError(field, "rows need at least 2 columns")
        if n_columns is not None and scores.shape[1] != n_columns:
            raise CalibrationInputError(
                field, f"rows have {scores.shape[1]} columns but this calibrator was fitted on {n_columns}", (0,)
            )
    if input == "probability":
        outside = (scores < 0.0) | (scores > 1.0)
        if outside.any():
            raise CalibrationInputError(
                field, "probabilities must lie in [0, 1]; send input='logit' for raw scores", first_index(outside)
            )
        if scores.ndim == 2 and "multiclass" in tasks:
            sums = scores.sum(axis=1)
            off = np.abs(sums - 1.0) > ROW_SUM_TOLERANCE
            if off.any():
                row = int(np.flatnonzero(off)[0])
                raise CalibrationInputError(
                    field, f"probability rows must sum to 1 (within {ROW_SUM_TOLERANCE}); this one sums to {sums[row]:.6g}", (row,)
                )
            scores = scores / sums[:, None]
    return scores


def encode_labels(
    labels: Any, n_samples: int, n_classes: int, classes: list[Any] | None = None, field: str = "labels"
) -> tuple[np.ndarray, list[Any] | None]:
    """Labels as ints 0..n_classes-1, and the class names when labels are strings.

    Integer labels are used as they are. String labels are mapped through
    ``classes`` (default: the sorted distinct labels, as scikit-learn's
    ``LabelEncoder`` orders them), whose order is the order of the score columns.
    """
    try:
        array = np.asarray(labels) if not isinstance(labels, np.ndarray) else labels
    except ValueError:  # ragged nesting
        raise CalibrationInputError(field, "must be a flat list of labels") from None
    if array.dtype.kind not in "US":
        codes = as_float_array(array, field, ndim=1)
        refuse_booleans(labels, codes, field)
        if codes.shape[0] != n_samples:
            raise CalibrationInputError(field, f"has {codes.shape[0]} entries but scores has {n_samples}")
        bad = (codes != np.floor(codes)) | (codes < 0) | (codes >= n_classes)
        if bad.any():
            allowed = "0 or 1" if n_classes == 2 else f"integers from 0 to {n_classes - 1}"
            raise CalibrationInputError(field, f"labels must be {allowed}", first_index(bad))
        return codes.astype(np.int8 if n_classes <= 127 else np.int32), None
    if array.ndim != 1:
        raise CalibrationInputError(field, "must be a flat list")
    if array.shape[0] != n_samples:
        raise CalibrationInputError(field, f"has {array.shape[0]} entries but scores has {n_samples}")
    names = np.unique(array) if classes is None else np.asarray(classes, dtype=str)
    if classes is not None and np.unique(names).shape[0] != names.shape[0]:
        raise CalibrationInputError("classes", "class names must be distinct")
    if names.shape[0] != n_classes:
        raise CalibrationInputError(
            "classes" if classes is not None else field,
            f"{names.shape[0]} distinct classes but the scores have {n_classes} columns",
        )
    order = np.argsort(names)
    position = np.clip(np.searchsorted(names[order], array), 0, n_classes - 1)
    unknown = names[order][position] != array
    if unknown.any():
        raise CalibrationInputError(field, "not one of the classes", first_index(unknown))
    return order[position].astype(np.int32), names.tolist()


def state_array(
    value: Any,
    name: str,
    ndim: int = 1,
    shape: tuple[int | None, ...] | None = None,
    within: tuple[float, float] | None = None,
    non_decreasing: bool = False,
) -> np.ndarray:
    """A learned array checked: its dimensions and ``shape`` (None: any length), values
    ``within`` [low, high], and for ``non_decreasing`` each element >= the one before it
    (along the first axis). Raises CalibrationInputError at ``state.<name>``."""
    field = f"state.{name}"
    if not isinstance(value, np.ndarray) or value.ndim != ndim or value.dtype.kind not in "fiu":
        raise CalibrationInputError(field, "must be a list of numbers" if ndim == 1 else f"must be a {ndim}-dimensional array of numbers")
    if shape is not None and any(want is not None and have != want for have, want in zip(value.shape, shape)):
        expected = " x ".join("n" if want is None else str(want) for want in shape)
        raise CalibrationInputError(field, f"has shape {' x '.join(map(str, value.shape))}, expected {expected}")
    if within is not None:
        outside = (value < within[0]) | (value > within[1])
        if outside.any():
            raise CalibrationInputError(field, f"must lie within [{within[0]:g}, {within[1]:g}]", first_index(outside))
    if non_decreasing and value.shape[0] > 1:
        falling = np.diff(value, axis=0) < 0
        if falling.any():
            index = first_index(falling)
            raise CalibrationInputError(field, "must be non-decreasing", (index[0] + 1, *index[1:]))
    return value


def state_number(value: Any, name: str, low: float | None = None, positive: bool = False) -> float:
    """A learned number checked: finite, and ``>= low`` or ``> 0`` when asked (an array of
    one number, as packed components hold their numbers, counts as that number)."""
    if isinstance(value, np.ndarray) and value.shape == (1,):
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise CalibrationInputError(f"state.{name}", "must be a finite number")
    if positive and not value > 0:
        raise CalibrationInputError(f"state.{name}", "must be positive")
    if low is not None and value < low:
        raise CalibrationInputError(f"state.{name}", f"must be at least {low:g}")
    return float(value)


def check_min_probability(value: Any, field: str = "options.min_probability") -> None:
    """The ``min_probability`` option of the step methods: null (automatic) or a number in [0, 0.5)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 0.5):
        raise CalibrationInputError(field, "must be null (automatic: 1 / (2 (n + 1))) or a number from 0 to below 0.5")


def keep_off_edges(values: np.ndarray, min_probability: float | None, n_rows: int) -> np.ndarray:
    """Learned output probabilities clipped to [m, 1 - m], so that no prediction is exactly 0 or 1.

    The step methods (isotonic, histograms, Venn-Abers) learn block or bin means, which are 0
    or 1 wherever a block saw one class only; one test row of the other class then costs an
    infinite log loss. The automatic floor (``min_probability`` null) is m = 1 / (2 (n + 1))
    for a holdout of n rows: the posterior mean of a probability under the Jeffreys prior
    Beta(1/2, 1/2) after n rows of which none was positive, that is the most extreme
    probability n rows can support. It shrinks as the holdout grows (5e-4 at n = 1,000), so
    that it changes ECE and Brier score by at most m. ``min_probability`` 0 keeps the raw means.
    """
    m = 0.5 / (n_rows + 1) if min_probability is None else float(min_probability)
    return np.clip(values, m, 1.0 - m) if m > 0 else values


def check_holdout(labels: np.ndarray, weights: np.ndarray, min_samples: int, n_classes: int = 2) -> None:
    """Reject holdouts that are too small, or that cannot be cross-fitted.

    Binary holdouts need both classes, multiclass ones at least two; every
    class present needs two rows, so that each cross-fitting fold's training
    part contains it.
    """
    n = labels.shape[0]
    if n < min_samples:
        raise CalibrationInputError("scores", f"needs at least {min_samples} samples, got n_samples={n}")
    counts = np.bincount(labels[weights > 0], minlength=n_classes)
    present = np.flatnonzero(counts)
    if n_classes == 2 and present.shape[0] < 2:
        missing = int(np.flatnonzero(counts == 0)[0])
        raise CalibrationInputError("labels", f"both classes are needed but no label is {missing}")
    if present.shape[0] < 2:
        raise CalibrationInputError("labels", "at least two classes must be present")
    rare = np.flatnonzero(counts == 1)
    if rare.shape[0]:
        raise CalibrationInputError(
            "labels", f"each class present needs at least 2 samples (cross-fitting); label {int(rare[0])} has 1"
        )


@dataclass(frozen=True)
class ArraySpec:
    """An extra named array a method takes beside the scores (``features``, ``X``, ...).

    ``rows``: one entry per holdout row (so cross-fitting splits it by fold);
    otherwise the array is passed whole to every fit.
    """

    ndim: int
    rows: bool
    required: bool = True
    description: str = ""
    #: A column-wise object of named categorical and numeric columns (``calibd.calibration.columns``).
    columns: bool = False


def check_arrays(arrays: dict[str, Any], specs: dict[str, ArraySpec], n_samples: int | None) -> dict[str, np.ndarray]:
    """Validate the extra arrays of a request against a method's declared specs."""
    for name in arrays:
        if name not in specs:
            expected = ", ".join(specs) or "none"
            raise CalibrationInputError(name, f"this method takes no array named {name!r} (it takes: {expected})")
    checked = {}
    for name, spec in specs.items():
        value = arrays.get(name)
        if value is None:
            if spec.required:
                raise CalibrationInputError(name, f"required by this method: {spec.description or 'an array'}")
            continue
        if spec.columns:
            checked[name] = check_columns(value, name, n_samples if spec.rows else None)
            continue
        array = as_float_array(value, name, ndim=spec.ndim)
        if spec.rows and n_samples is not None and array.shape[0] != n_samples:
            raise CalibrationInputError(name, f"has {array.shape[0]} rows but scores has {n_samples}")
        checked[name] = array
    return checked


def column_names(X: Any) -> np.ndarray | None:
    """A DataFrame's column names, when they are all strings (scikit-learn's ``feature_names_in_``)."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray(list(columns), dtype=object)
    return names if names.shape[0] and all(isinstance(n, str) for n in names) else None


def numbers_from_objects(array: np.ndarray, field: str) -> np.ndarray:
    """An object array of numbers as float64; anything else (None, str, bool, dict) is refused."""
    for index, value in enumerate(array.ravel()):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
            raise CalibrationInputTypeError(
                field,
                f"must contain only numbers; found {type(value).__name__!r} (an argument must be a real number; "
                "a string, a boolean or None is not a number)",
                tuple(int(i) for i in np.unravel_index(index, array.shape)),
            )
    return array.astype(np.float64)


def labels_from_y(y: Any, n_classes: int) -> tuple[Any, np.ndarray | None]:
    """scikit-learn's ``y`` as labels, and ``classes_`` when they are not 0..K-1.

    Labels that are column indices 0..K-1 are used as they are. Otherwise K distinct
    values are taken in sorted order (for binary labels, the second is the positive
    class), as scikit-learn classifiers order ``classes_`` and calibd orders class names.
    """
    labels = np.asarray(y)
    if labels.dtype.kind == "O":
        if all(isinstance(v, str) for v in labels.ravel()):
            labels = labels.astype(str)
        elif all(isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) for v in labels.ravel()):
            labels = labels.astype(np.float64)
        else:
            raise CalibrationInputError("labels", "Unknown label type: labels must be numbers or strings")
    if labels.ndim == 1 and labels.dtype.kind in "iuf":
        values = np.unique(labels)
        indices = np.isin(values, np.arange(n_classes)).all()
        if not indices and values.shape[0] == n_classes and np.isfinite(values).all():
            return np.searchsorted(values, labels).astype(np.int32), values
    return labels, None


def n_classes_of(scores: np.ndarray, tasks: tuple[str, ...]) -> int:
    """2 for flat binary scores and multivariate rows; K for multiclass rows of K."""
    return scores.shape[1] if scores.ndim == 2 and "multiclass" in tasks else 2
