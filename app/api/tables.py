"""Holdouts and feedback as tables: Parquet files and Arrow IPC streams.

A table names its columns as a CSV upload does: ``label``, ``score`` (binary)
or ``score_0`` ... ``score_{K-1}`` (rows of K), optionally ``weight``, and a
method's extra arrays under their own names: one numeric column for a flat
array, and for rows either a list column or ``<name>_0`` ... ``<name>_{M-1}``.
Feedback tables take ``label`` with either ``id`` or ``probability`` (or
``probability_0`` ...), and optionally ``accepted`` (booleans) and ``score``.
Named columns, the JSON bodies' column-wise objects, go by a prefix:
``feature.<name>`` (strings or numbers, as ``features``; holdouts and feedback)
and ``segment.<dimension>`` (strings, as ``segments``; feedback).

Columns go from Arrow to numpy whole (no Python lists); nulls, booleans where
numbers belong and mistyped columns are refused with a 422 that names the column.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ..calibration import CalibrationInputError
from .bodies import media_type
from .limits import RowBudget, check_ipc_stream, check_parquet
from .problems import Problem, pointer

ARROW_STREAM = "application/vnd.apache.arrow.stream"
PARQUET_MAGIC = b"PAR1"

#: Locates a core validation error in the request.
ErrorLocator = Callable[[CalibrationInputError], Problem]

_NUMBERED = re.compile(r"^(.+)_(\d+)$")


def is_parquet(head: bytes) -> bool:
    return head[:4] == PARQUET_MAGIC


def read_table(source: str | bytes, kind: str, where: tuple[str, ...], budget: RowBudget | None = None) -> pa.Table:
    """A Parquet file or Arrow IPC stream, from a path (memory-mapped) or bytes; with a ``budget``,
    its rows and decompressed size are checked against it first, from the file's metadata."""
    try:
        if kind == "parquet":
            file = pq.ParquetFile(source if isinstance(source, str) else pa.BufferReader(source), memory_map=True)
            if budget is not None:
                check_parquet(file, budget, where)
            # The file's own reader, not pyarrow.dataset's: its errors name the file's columns.
            return file.read()
        if budget is not None:
            check_ipc_stream(source, budget.rows, budget.decoded_bytes, budget.setting, where)
        stream = pa.memory_map(source) if isinstance(source, str) else pa.BufferReader(source)
        return pa.ipc.open_stream(stream).read_all()
    except (pa.ArrowException, OSError) as error:
        what = "a Parquet file" if kind == "parquet" else "an Arrow IPC stream"
        raise Problem.invalid(pointer(*where), f"not readable as {what}: {error}") from None


def _column_error(where: tuple[str, ...], column: str, detail: str, row: int | None = None) -> Problem:
    at = pointer(*where, column, *(() if row is None else (row,)))
    return Problem.invalid(at, f"column {column!r}: {detail}" if row is None else f"column {column!r}, row {row}: {detail}")


def _no_nulls(column: pa.ChunkedArray, name: str, where: tuple[str, ...]) -> None:
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise _column_error(where, name, "must not be null", row)


def numeric_column(table: pa.Table, name: str, where: tuple[str, ...]) -> np.ndarray:
    """A numeric column as float64: 1-D, or 2-D from a list column of equal-length rows."""
    column = table.column(name)
    kind = column.type
    _no_nulls(column, name, where)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        if not _is_number(kind.value_type):
            raise _column_error(where, name, f"lists must hold numbers, not {kind.value_type}")
        flat = column.combine_chunks()
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            raise _column_error(where, name, "rows must all have the same length", int(np.flatnonzero(lengths != lengths[0])[0]))
        values = pc.list_flatten(flat)
        if values.null_count:
            raise _column_error(where, name, "must not hold nulls")
        width = int(lengths[0]) if lengths.size else 0
        return values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).reshape(len(flat), width)
    if not _is_number(kind):
        raise _column_error(where, name, f"must hold numbers, not {kind}")
    return column.to_numpy().astype(np.float64, copy=False)


def label_column(table: pa.Table, name: str, where: tuple[str, ...]) -> np.ndarray:
    """Labels: integers (or whole floats) as they are, class names as a numpy string array."""
    column = table.column(name)
    kind = column.type
    _no_nulls(column, name, where)
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=str)
    if not _is_number(kind):
        raise _column_error(where, name, f"must hold integers or class names, not {kind}")
    return column.to_numpy()


def _is_number(kind: pa.DataType) -> bool:
    # Booleans are not numbers here, as in JSON bodies.
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _grouped(names: list[str], where: tuple[str, ...]) -> tuple[dict[str, list[str]], list[str]]:
    """Numbered columns (``<name>_0..<name>_{M-1}``) grouped by name, and the other columns."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for column in names:
        match = _NUMBERED.match(column)
        if match:
            groups.setdefault(match.group(1), []).append((int(match.group(2)), column))
    single = [c for c in names if not any(c in [n for _, n in g] for g in groups.values())]
    ordered = {}
    for base, members in groups.items():
        members.sort()
        if [k for k, _ in members] != list(range(len(members))):
            raise _column_error(where, members[0][1], f"columns {base}_0, {base}_1, ... must not have gaps")
        ordered[base] = [column for _, column in members]
    return ordered, single


def _matrix(table: pa.Table, columns: list[str], where: tuple[str, ...]) -> np.ndarray:
    out = np.empty((table.num_rows, len(columns)), dtype=np.float64)
    for j, column in enumerate(columns):
        out[:, j] = numeric_column(table, column, where)
    return out


#: Named columns by prefix, and the field of the JSON body they stand for.
FEATURE, SEGMENT = "feature.", "segment."
_NAMED_FIELDS = {FEATURE: "features", SEGMENT: "segments"}


def _named_columns(table: pa.Table, prefix: str, shape: TableShape) -> dict[str, list] | None:
    """The ``<prefix><name>`` columns as the JSON body's column-wise object, {name: values}
    (strings or numbers; nulls as None, which the core refuses where they may not be)."""
    field = _NAMED_FIELDS[prefix]
    out: dict[str, list] = {}
    for column in table.column_names:
        if not column.startswith(prefix):
            continue
        values = table.column(column)
        kind = values.type
        if pa.types.is_dictionary(kind):
            values, kind = values.cast(kind.value_type), kind.value_type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_number(kind)):
            raise _column_error(shape.where, column, f"must hold strings or numbers, not {kind}")
        name = column[len(prefix):]
        shape.columns[f"{field}.{name}"] = column
        out[name] = values.to_pylist()
    return out or None


def _unnamed(names: list[str]) -> list[str]:
    return [name for name in names if not name.startswith(tuple(_NAMED_FIELDS))]


class TableShape:
    """Where each array of a parsed table came from, to name the column of a core error."""

    def __init__(self, where: tuple[str, ...]):
        self.where = where
        #: array name -> its one column, or its numbered columns
        self.columns: dict[str, str | list[str]] = {}

    def read(self, table: pa.Table, array: str, base: str, groups: dict[str, list[str]], single: list[str]) -> np.ndarray | None:
        if base in groups:
            self.columns[array] = groups[base]
            return _matrix(table, groups[base], self.where)
        if base in single:
            self.columns[array] = base
            return numeric_column(table, base, self.where)
        return None

    def error(self, error: CalibrationInputError) -> Problem:
        """A core validation error, pointed at its column (and row) in the table."""
        head = error.field.partition(".")[0]
        if head in ("options", "input", "method", "classes"):
            return Problem.invalid("/" + error.field.replace(".", "/"), error.detail)
        source = self.columns.get(error.field, error.field)
        if source == error.field and error.field.partition(".")[0] in _NAMED_FIELDS.values():
            return Problem.invalid("/" + error.field.replace(".", "/"), error.detail)  # not one column: the object
        index = tuple(error.index or ())
        if isinstance(source, list):
            column = source[index[1]] if len(index) > 1 else source[0]
        else:
            column = source
        return _column_error(self.where, column, error.detail, index[0] if index else None)


def _unique_names(table: pa.Table, where: tuple[str, ...]) -> list[str]:
    names = table.column_names
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise _column_error(where, duplicate, "appears twice")
    return names


def holdout_from_table(table: pa.Table, where: tuple[str, ...] = ()) -> tuple[dict[str, Any], TableShape]:
    """The holdout arrays of a table (``scores``, ``labels``, ``sample_weight``, extra arrays)."""
    names = _unique_names(table, where)
    if table.num_rows == 0:
        raise Problem.invalid(pointer(*where), "the table has no rows")
    shape = TableShape(where)
    segment = next((n for n in names if n.startswith(SEGMENT)), None)
    if segment is not None:
        raise _column_error(where, segment, "segments come with feedback; a fit declares its dimensions (\"segments\")")
    features = _named_columns(table, FEATURE, shape)
    names = _unnamed(names)
    groups, single = _grouped(names, where)
    if "label" not in single:
        raise _column_error(where, "label", "missing (the table has: " + ", ".join(names) + ")")
    if "score" in single and "score" in groups:
        raise _column_error(where, "score", "give either one 'score' column or score_0..score_{K-1}, not both")
    scores = shape.read(table, "scores", "score", groups, single)
    if scores is None:
        raise _column_error(where, "score", "missing: give 'score' or score_0..score_{K-1} (the table has: " + ", ".join(names) + ")")
    shape.columns["labels"] = "label"
    holdout: dict[str, Any] = {"scores": scores, "labels": label_column(table, "label", where)}
    holdout["sample_weight"] = shape.read(table, "sample_weight", "weight", groups, single)
    for base in [*groups, *single]:
        if base not in ("label", "score", "weight"):
            holdout[base] = shape.read(table, base, base, groups, single)
    if features is not None:
        if "features" in holdout:
            raise _column_error(where, "features", "give the features either as feature.<name> columns or as 'features', not both")
        holdout["features"] = features
    return holdout, shape


def feedback_from_table(table: pa.Table, where: tuple[str, ...] = ()) -> tuple[dict[str, Any], TableShape]:
    """The arrays of a feedback table, by the JSON body's names (``ids``, ``labels``,
    ``probabilities``, ``accepted``, ``scores``, ``features``, ``segments``)."""
    names = _unique_names(table, where)
    shape = TableShape(where)
    named = {field: _named_columns(table, prefix, shape) for prefix, field in _NAMED_FIELDS.items()}
    groups, single = _grouped(_unnamed(names), where)
    known = {"id", "label", "probability", "accepted", "score"}
    for column in [*groups, *single]:
        if column not in known:
            raise _column_error(
                where, column, "unknown column (expected label with id, or probability, accepted, score; "
                "feature.<name>, segment.<dimension>)",
            )
    if "label" not in single:
        raise _column_error(where, "label", "missing (the table has: " + ", ".join(names) + ")")
    if table.num_rows == 0:
        raise Problem.invalid(pointer(*where), "the table has no rows")
    shape.columns["labels"] = "label"
    out: dict[str, Any] = {"labels": label_column(table, "label", where)}
    if "id" in single:
        column = table.column("id")
        _no_nulls(column, "id", where)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise _column_error(where, "id", f"must hold strings, not {column.type}")
        out["ids"] = column.to_pylist()  # ids are stored one row each
    out["probabilities"] = shape.read(table, "probabilities", "probability", groups, single)
    out["scores"] = shape.read(table, "scores", "score", groups, single)
    if "accepted" in single:
        column = table.column("accepted")
        _no_nulls(column, "accepted", where)
        if not pa.types.is_boolean(column.type):
            raise _column_error(where, "accepted", f"must hold booleans, not {column.type}")
        out["accepted"] = column.to_numpy(zero_copy_only=False).tolist()
    out.update(named)
    return out, shape


async def read_table_request(request: Any, budget: RowBudget) -> tuple[dict[str, str], pa.Table, tuple[str, ...]] | None:
    """A table sent whole (not to a fit worker): an Arrow IPC stream with its fields as query
    parameters, or a multipart upload of a Parquet file with its fields beside it; None for
    any other body. Returns (fields, table, where the table's columns sit in the request)."""
    kind = media_type(request.headers)
    if kind == ARROW_STREAM:
        body = await request.body()
        return dict(request.query_params), await run_in_threadpool(read_table, body, "arrow", (), budget), ()
    if kind == "multipart/form-data":
        async with request.form(max_files=1, max_fields=16) as form:
            fields = {key: value for key, value in form.items() if not isinstance(value, UploadFile)}
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise Problem.invalid("/file", "a Parquet file is required in the 'file' field")
            content = await upload.read()
        return fields, await run_in_threadpool(read_table, content, "parquet", ("file",), budget), ("file",)
    return None


def feedback_request(fields: dict[str, str], table: pa.Table, where: tuple[str, ...]) -> tuple[Any, ErrorLocator]:
    """A ``FeedbackRequest`` from a table and its fields (``calibrator``, optionally ``version``),
    its arrays as numpy arrays, and the locator of core errors in the table."""
    from .feedback.schemas import FeedbackRequest
    from .validation import validate

    envelope: dict[str, Any] = {"labels": [0]}
    for key, value in fields.items():
        if key not in ("calibrator", "version"):
            raise Problem.invalid(f"/{key}", "unknown field (a feedback table takes calibrator and version)")
        envelope[key] = value
    if "version" in envelope:
        text = envelope["version"].strip()
        envelope["version"] = int(text) if text.isdigit() else text
    arrays, shape = feedback_from_table(table, where)
    body = validate(FeedbackRequest, envelope)
    return body.model_copy(update={k: v for k, v in arrays.items() if v is not None}), shape.error


def table_body(openapi: dict[str, Any]) -> dict[str, Any]:
    """An operation's OpenAPI ``requestBody`` that also takes an Arrow IPC stream."""
    openapi["requestBody"]["content"][ARROW_STREAM] = {
        "schema": {"type": "string", "format": "binary", "description": "an Arrow IPC stream of the table's columns"}
    }
    return openapi



__all__ = [
    "ARROW_STREAM", "TableShape", "feedback_request", "read_table_request", "table_body", "feedback_from_table", "holdout_from_table", "is_parquet", "label_column",
    "numeric_column", "read_table",
]
