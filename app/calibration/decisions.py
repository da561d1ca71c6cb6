"""Decisions that minimise expected cost, from calibrated probabilities.

Binary, with costs a of a false positive and b of a false negative: decide 1
exactly when its expected cost (1 - p) a is below that of 0, p b, that is when

    p > a / (a + b).

Multiclass, with a cost matrix C[i][j] of deciding j when the truth is i:
decide argmin_j sum_i p_i C[i][j] (ties go to the lowest class).

These are the Bayes decisions, optimal exactly when the probabilities are
calibrated (papers/003, claim 1): a miscalibrated p moves the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inputs import CalibrationInputError, refuse_booleans


def check_costs(costs: Any, n_classes: int) -> np.ndarray | tuple[float, float]:
    """Binary: (false_positive, false_negative); multiclass: the K x K matrix."""
    if n_classes == 2 and isinstance(costs, dict):
        unknown = set(costs) - {"false_positive", "false_negative"}
        if unknown:
            raise CalibrationInputError(f"costs.{sorted(unknown)[0]}", "binary costs are false_positive and false_negative")
        values = []
        for key in ("false_positive", "false_negative"):
            value = costs.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise CalibrationInputError(f"costs.{key}", "must be a finite number >= 0")
            values.append(float(value))
        if values[0] + values[1] <= 0:
            raise CalibrationInputError("costs", "at least one cost must be positive")
        return values[0], values[1]
    try:
        matrix = np.asarray(costs, dtype=np.float64)
    except (TypeError, ValueError):
        matrix = None
    if matrix is None or matrix.shape != (n_classes, n_classes):
        expected = '{"false_positive": a, "false_negative": b}, or a 2 x 2 matrix' if n_classes == 2 else ""
        raise CalibrationInputError(
            "costs", f"must be a {n_classes} x {n_classes} matrix C[true][decided]" + (f" ({expected})" if expected else "")
        )
    refuse_booleans(costs, matrix, "costs")
    if not np.isfinite(matrix).all() or (matrix < 0).any():
        raise CalibrationInputError("costs", "costs must be finite numbers >= 0")
    return matrix


def decide(probabilities: np.ndarray, costs: np.ndarray | tuple[float, float]) -> np.ndarray:
    """The class of least expected cost for each row (or each binary probability)."""
    if isinstance(costs, tuple):
        false_positive, false_negative = costs
        return (probabilities > false_positive / (false_positive + false_negative)).astype(np.int64)
    rows = probabilities if probabilities.ndim == 2 else np.column_stack([1.0 - probabilities, probabilities])
    return np.argmin(rows @ costs, axis=1)
