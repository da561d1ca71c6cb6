"""Named columns sent column-wise, one entry per row: ``{"country": ["br", ...], "age": [31, ...]}``.

A column of strings is categorical; a column of numbers (``null`` for a
missing value) is numeric. ``Columns`` indexes by rows like a numpy array
(``columns[mask]``), so that cross-fitting splits it with the holdout.
"""

from __future__ import annotations

import hashlib
from numbers import Real
from typing import Any

import numpy as np

from ..metrics.multicalibration import COLUMN_NAME  # the same names as segments
from ..inputs import CalibrationInputError

MAX_COLUMNS = 64


class Columns:
    """Validated columns: float64 arrays (NaN where missing) or object arrays of str."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def __len__(self) -> int:
        return next(iter(self.columns.values())).shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), len(self.columns))

    def __getitem__(self, rows: Any) -> Columns:
        return Columns({name: values[rows] for name, values in self.columns.items()})

    def kinds(self) -> dict[str, str]:
        return {name: "categorical" if v.dtype == object else "numeric" for name, v in self.columns.items()}

    def digest(self) -> bytes:
        """sha256 of the names, kinds and values, for holdout fingerprints."""
        h = hashlib.sha256()
        for name, values in sorted(self.columns.items()):
            h.update(f"{name}:{values.dtype.kind}:{values.shape[0]}".encode())
            if values.dtype == object:
                h.update("\x00".join(values.tolist()).encode())
            else:
                h.update(np.ascontiguousarray(values, dtype="<f8").tobytes())
        return h.digest()


def check_columns(value: Any, field: str, n_samples: int | None) -> Columns:
    """Validate a column-wise object; errors name ``field.column`` and the first bad row."""
    if isinstance(value, Columns):
        return value
    if not isinstance(value, dict) or not value:
        raise CalibrationInputError(field, 'must be an object of named columns, e.g. {"country": ["br", ...], "age": [31, ...]}')
    if len(value) > MAX_COLUMNS:
        raise CalibrationInputError(field, f"at most {MAX_COLUMNS} columns")
    out: dict[str, np.ndarray] = {}
    length = n_samples
    for name, values in value.items():
        if not isinstance(name, str) or not COLUMN_NAME.fullmatch(name):
            raise CalibrationInputError(field, f"column names are 1 to 64 letters, digits, '_' or '-' (got {str(name)[:70]!r})")
        where = f"{field}.{name}"
        if isinstance(values, np.ndarray):
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            raise CalibrationInputError(where, "must be a list, one value per row")
        if length is None:
            length = len(values)
        if len(values) != length:
            raise CalibrationInputError(where, f"has {len(values)} values but there are {length} rows")
        if length == 0:
            raise CalibrationInputError(where, "must not be empty")
        first = next((v for v in values if v is not None), None)
        if isinstance(first, str):
            for i, v in enumerate(values):
                if not isinstance(v, str):
                    raise CalibrationInputError(where, "a categorical column holds strings only", (i,))
            column = np.empty(length, dtype=object)
            column[:] = values
        else:
            for i, v in enumerate(values):
                if v is not None and (isinstance(v, bool) or not isinstance(v, Real)):
                    raise CalibrationInputError(where, "a numeric column holds numbers or null only", (i,))
            column = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            infinite = np.isinf(column)
            if infinite.any():
                raise CalibrationInputError(where, "must be finite", (int(np.flatnonzero(infinite)[0]),))
        out[name] = column
    return Columns(out)
