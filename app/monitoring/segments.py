"""Per-segment monitors: which segment a row belongs to, and each segment test's share of alpha.

A calibrator declares the categorical attributes it monitors (its
*dimensions*, e.g. ``country`` and ``device``) and a cap ``max_values`` per
dimension. Every (dimension, value) pair seen in labelled feedback is a
*segment* with the same windows, metrics and anytime-valid drift test
(``DriftTest``) as the calibrator's own monitor, fed only that segment's rows.

Tracked values: first come, first tracked
-----------------------------------------
A dimension tracks at most ``max_values`` distinct values: the first ones met
in feedback, in arrival order. Any later value goes to the one pooled segment
``OTHER`` (``"__OTHER"``, the name /evaluate gives its pooled values too), so
a dimension has at most ``max_values + 1`` segments, and metric label
cardinality stays bounded whatever the traffic sends. The tracked values are
stored, so every replica assigns a value to the same segment.

Family-wise false-alarm rate
----------------------------
The segment tests of a version share alpha as one budget, given out label by
label to the segments the labels belong to (``calibd.monitoring.segment_drift``):
the chance that any calibrated segment ever alarms is at most alpha. The
earlier design, kept for the benchmark's comparison, split alpha over the
declared capacity, m = D (M + 1) tests of alpha / m each (``segment_alpha``).

References: J. Ville, Etude critique de la notion de collectif (1939);
V. Vovk, R. Wang, "E-values: calibration, combination and applications",
Annals of Statistics 49 (2021), for e-values under multiple testing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibd.calibration.base import CalibrationInputError
from calibd.metrics.multicalibration import COLUMN_NAME, MAX_COLUMNS, OTHER, check_segments

__all__ = [
    "DEFAULT_MAX_VALUES", "MAX_VALUES", "MAX_VALUE_LENGTH", "OTHER", "assign", "check_declaration", "check_rows",
    "segment_alpha",
]

DEFAULT_MAX_VALUES = 50
#: Cap on max_values: D (M + 1) gauges per window for one calibrator version.
MAX_VALUES = 1000
#: Longest segment value (the database column's width).
MAX_VALUE_LENGTH = 256


def check_declaration(value: Any, field: str = "segments") -> dict[str, Any]:
    """``{"dimensions": [names], "max_values": M}``: 1 to 16 distinct names, 1 <= M <= 1000 (default 50)."""
    if not isinstance(value, dict):
        raise CalibrationInputError(field, 'must be an object: {"dimensions": ["country", ...], "max_values": 50}')
    unknown = set(value) - {"dimensions", "max_values"}
    if unknown:
        raise CalibrationInputError(f"{field}.{sorted(unknown)[0]}", "unknown field")
    dimensions = value.get("dimensions")
    if not isinstance(dimensions, list) or not 1 <= len(dimensions) <= MAX_COLUMNS:
        raise CalibrationInputError(f"{field}.dimensions", f"must be a list of 1 to {MAX_COLUMNS} attribute names")
    for i, name in enumerate(dimensions):
        if not isinstance(name, str) or not COLUMN_NAME.fullmatch(name):
            raise CalibrationInputError(f"{field}.dimensions", "names are 1 to 64 letters, digits, '_' or '-'", (i,))
        if name in dimensions[:i]:
            raise CalibrationInputError(f"{field}.dimensions", f"{name!r} is named twice", (i,))
    max_values = value.get("max_values", DEFAULT_MAX_VALUES)
    if type(max_values) is not int or not 1 <= max_values <= MAX_VALUES:
        raise CalibrationInputError(f"{field}.max_values", f"must be an integer from 1 to {MAX_VALUES}")
    return {"dimensions": list(dimensions), "max_values": max_values}


def segment_alpha(alpha: float, n_dimensions: int, max_values: int) -> float:
    """The earlier design's share of alpha per segment test: alpha / (D (M + 1)), D (M + 1) tests at most."""
    return alpha / (n_dimensions * (max_values + 1))


def assign(values: np.ndarray, tracked: list[str], max_values: int) -> tuple[np.ndarray, list[str]]:
    """The segment of each row of one dimension, and the values newly tracked (first come, first tracked).

    ``values`` holds strings, or None for rows without a value (in no segment
    of this dimension; their entry stays None). ``tracked`` lists the values
    already tracked, in the order they were; those past ``max_values`` (after
    the cap was lowered) pool into OTHER like any value not tracked.
    """
    kept = set(tracked[:max_values])
    room = max_values - len(kept)
    new: list[str] = []
    out = np.empty(values.shape[0], dtype=object)
    for i, value in enumerate(values.tolist()):
        if value is None or value in kept:
            out[i] = value
        elif room > 0 and value != OTHER and value not in tracked:
            kept.add(value)
            new.append(value)
            room -= 1
            out[i] = value
        else:
            out[i] = OTHER
    return out, new


def check_rows(value: Any, n: int, declared: dict[str, Any] | None, field: str = "segments") -> dict[str, np.ndarray]:
    """Segment values sent with n rows: /evaluate's column-wise check, then each column a declared dimension."""
    if declared is None:
        raise CalibrationInputError(
            field, "this calibrator declares no segment dimensions (PUT /calibrators/{name}/segments)"
        )
    columns = check_segments(value, n, field)
    for name, column in columns.items():
        if name not in declared["dimensions"]:
            raise CalibrationInputError(f"{field}.{name}", f"not a declared dimension (declared: {', '.join(declared['dimensions'])})")
        for i, text in enumerate(column.tolist()):
            if not 0 < len(text) <= MAX_VALUE_LENGTH:
                raise CalibrationInputError(f"{field}.{name}", f"values are 1 to {MAX_VALUE_LENGTH} characters", (i,))
    return columns
