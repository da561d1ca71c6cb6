"""The upload form of a fit: multipart/form-data with the fit's fields and a file.

The file is either a CSV with a header row naming its columns (``label``, then
``score`` or ``score_0`` ... ``score_{K-1}``, optionally ``weight``), a Parquet
file with the same columns (and a method's extra columns; see ``calibd.api.tables``), or an
``.npz`` archive whose keys use the JSON names (``scores``, ``labels``,
``sample_weight``, ``classes``, and a method's extra arrays). Archives are read
with ``allow_pickle=False``: an upload can never run code.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from fastapi import Request
from starlette.datastructures import UploadFile

from ...calibration import CalibrationInputError
from ..bodies import parse_json
from ..limits import RowBudget, TooManyRows, check_csv_rows
from ..problems import Problem, pointer
from ..tables import holdout_from_table, is_parquet, read_table
from ..validation import validate
from .schemas import FitRequest, Holdout


def _csv_columns(header: str) -> tuple[dict[str, int], list[int]]:
    """Positions of the named columns, and of the score columns in order (score, or score_0..score_{K-1})."""
    columns = [c.strip().strip('"') for c in header.split(",")]
    for position, column in enumerate(columns):
        if column not in ("label", "score", "weight") and not (column.startswith("score_") and column[6:].isdigit()):
            raise Problem.invalid("/file", f"unknown column {column!r} in the header (expected label, score or score_0.., weight)")
        if columns.index(column) != position:
            raise Problem.invalid("/file", f"column {column!r} appears twice in the header")
    if "label" not in columns:
        raise Problem.invalid("/file", "the header has no 'label' column")
    numbered = sorted((int(c[6:]), i) for i, c in enumerate(columns) if c.startswith("score_"))
    if "score" in columns and numbered:
        raise Problem.invalid("/file", "give either one 'score' column or score_0..score_{K-1}, not both")
    if numbered:
        if [k for k, _ in numbered] != list(range(len(numbered))):
            raise Problem.invalid("/file", "score columns must be score_0, score_1, ... without gaps")
        score_positions = [i for _, i in numbered]
    elif "score" in columns:
        score_positions = [columns.index("score")]
    else:
        raise Problem.invalid("/file", "the header has no 'score' (or score_0..score_{K-1}) column")
    return {column: position for position, column in enumerate(columns)}, score_positions


def _first_bad_line(rows: str, columns: list[str], numeric: set[str]) -> str:
    """Say where a CSV that numpy refused goes wrong (lines counted from the header, line 1)."""
    for number, line in enumerate(rows.splitlines(), start=2):
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != len(columns):
            return f"line {number} has {len(fields)} fields but the header names {len(columns)}"
        for column, field in zip(columns, fields):
            if column in numeric and not _NUMBER.fullmatch(field.strip().removeprefix('"').removesuffix('"').strip()):
                return f"line {number}, column {column}: {field.strip()!r} is not a number"
    return "the file is not a CSV of numbers"


#: A number as numpy's CSV reader takes it (Python's float() also takes 0.5_0, numpy does not).
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)


def parse_csv(content: bytes, budget: RowBudget | None = None) -> dict[str, Any]:
    """Columns of a holdout CSV as arrays, in the shape of ``Holdout``.

    Labels may be numbers or class names; scores and weights must be numbers. Fields may be
    quoted (``"0.5"``), as the header's names may be.
    """
    if budget is not None:
        check_csv_rows(content, budget.rows, budget.setting, "/file")
    try:
        text = content.decode("utf-8-sig", errors="strict") if content else ""
    except UnicodeDecodeError as error:
        raise Problem.invalid("/file", f"neither a UTF-8 CSV nor an .npz archive (byte {error.start} is not UTF-8)") from None
    header, _, rows = text.partition("\n")
    columns, score_positions = _csv_columns(header.strip())
    if not rows.strip():
        raise Problem.invalid("/file", "the file has a header but no rows")
    names = list(columns)
    numeric_positions = [i for i, c in enumerate(names) if c != "label"]
    try:
        table = np.loadtxt(io.StringIO(rows), delimiter=",", dtype=np.float64, ndmin=2, usecols=numeric_positions, quotechar='"')
        labels = np.loadtxt(io.StringIO(rows), delimiter=",", dtype=str, ndmin=1, usecols=columns["label"], quotechar='"')
    except ValueError:
        raise Problem.invalid("/file", _first_bad_line(rows, names, set(names) - {"label"})) from None
    if rows.count(",") != table.shape[0] * (len(names) - 1):  # a row with too many or too few fields
        raise Problem.invalid("/file", _first_bad_line(rows, names, set(names) - {"label"}))
    labels = np.char.strip(labels)
    try:
        labels = labels.astype(np.float64)  # numeric labels stay numbers; class names stay strings
    except ValueError:
        pass
    column_of = {position: index for index, position in enumerate(numeric_positions)}
    scores = table[:, [column_of[p] for p in score_positions]]
    return {
        "scores": scores[:, 0] if len(score_positions) == 1 and "score" in columns else scores,
        "labels": labels,
        "sample_weight": table[:, column_of[columns["weight"]]] if "weight" in columns else None,
    }


def parse_npz(content: bytes, budget: RowBudget | None = None) -> dict[str, Any]:
    """Arrays of an .npz holdout, by their JSON names; each member's ``.npy`` header is checked
    (and against ``budget``) before its data is inflated."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            for member in archive.infolist():
                _check_npy_header(archive, member, budget)
            with np.load(io.BytesIO(content), allow_pickle=False) as loaded:
                arrays = {key: loaded[key] for key in loaded.files}
    except Problem:
        raise
    except Exception as error:  # noqa: BLE001 - zipfile, zlib and numpy's header parser raise a dozen kinds
        raise Problem.invalid("/file", f"not a readable .npz archive without pickled objects: {error}") from None
    # The angular method's archives name its holdout u_holdout and y_holdout.
    for alias, name in (("u_holdout", "scores"), ("y_holdout", "labels")):
        if alias in arrays and name not in arrays:
            arrays[name] = arrays.pop(alias)
    for required in ("scores", "labels"):
        if required not in arrays:
            raise Problem.invalid("/file", f"the archive has no {required!r} array")
    if "classes" in arrays:
        arrays["classes"] = arrays["classes"].tolist()
    arrays.setdefault("sample_weight", None)
    return arrays


def _check_npy_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo, budget: RowBudget | None) -> None:
    """Refuse a member whose header declares a 0-d array, objects, more rows than the budget, or more
    bytes than it allows (or than the member holds), from the header alone."""
    name = member.filename[:-4] if member.filename.endswith(".npy") else member.filename
    at = pointer("file", name)
    if budget is not None and member.file_size > budget.decoded_bytes + 65_536:
        raise TooManyRows.decoded(at, member.file_size, budget.decoded_bytes)
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=_MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=_MAX_NPY_HEADER)
        else:
            raise Problem.invalid(at, f".npy format version {version[0]}.{version[1]} is not supported (1.0 or 2.0)")
        header_end = stream.tell()
    if dtype.hasobject:
        raise Problem.invalid(at, "holds Python objects, which are never loaded (allow_pickle is off)")
    if not shape:
        raise Problem.invalid(at, "is a 0-d array; give a 1-d or 2-d array")
    if budget is not None and shape[0] > budget.rows:
        raise TooManyRows.rows(at, f"{shape[0]:,}", budget.rows, budget.setting)
    size = math.prod(shape) * dtype.itemsize
    if budget is not None and size > budget.decoded_bytes:
        raise TooManyRows.decoded(at, size, budget.decoded_bytes)
    if header_end + size > member.file_size:
        raise Problem.invalid(at, f"its header declares {size:,} bytes of data but the member holds {member.file_size - header_end:,}")


#: The longest .npy header read (numpy's own default limit).
_MAX_NPY_HEADER = 10_000


async def read_form(request: Request, spool: Callable[[Any], Awaitable[str | None]] | None = None) -> tuple[dict[str, str], bytes | str]:
    """The text fields and the file of a multipart upload, read as it streams in.

    With ``spool``, a Parquet file is handed to it (it answers a path, or None to
    keep the file in memory), so that the fit worker maps the file as it is.
    """
    async with request.form(max_files=1, max_fields=16) as form:
        fields = {key: value for key, value in form.items() if not isinstance(value, UploadFile)}
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise Problem.invalid("/file", "a CSV, Parquet or .npz file is required in the 'file' field")
        if spool is not None and is_parquet(await upload.read(4)):
            await upload.seek(0)
            path = await spool(upload)
            if path is not None:
                return fields, path
        await upload.seek(0)
        content = await upload.read()
    return fields, content


def form_fit_request(fields: dict[str, str]) -> FitRequest:
    """The fit's fields, sent as text (form fields, or query parameters beside an Arrow stream)."""
    fields = dict(fields)
    options = parse_json(fields.pop("options", "{}").encode() or b"{}")
    unknown = set(fields) - {"name", "method", "input", "promote"}
    if unknown:
        raise Problem.invalid(f"/{sorted(unknown)[0]}", "unknown field")
    if "promote" in fields:  # form fields are text; the JSON form of the fit takes a boolean
        fields["promote"] = {"true": True, "false": False}.get(fields["promote"].strip().lower(), fields["promote"])
    envelope = {**fields, "options": options, "holdout": {"scores": [0], "labels": [0]}}
    return validate(FitRequest, envelope)


def parse_upload(
    fields: dict[str, str], content: bytes | str, budget: RowBudget | None = None
) -> tuple[FitRequest, dict[str, Any], Callable]:
    """The fit request, holdout arrays, and the locator of errors in the file, of an upload
    (``content``: the file's bytes, or the path of a spooled Parquet file), its rows within ``budget``."""
    fit = form_fit_request(fields)
    if isinstance(content, str) or is_parquet(content):
        holdout, shape = holdout_from_table(read_table(content, "parquet", ("file",), budget), ("file",))
        return fit, holdout, shape.error
    is_npz = content[:2] == b"PK"  # any zip, so that a broken one is read (and refused) as an archive
    holdout = parse_npz(content, budget) if is_npz else parse_csv(content, budget)
    return fit, holdout, npz_input_error if is_npz else csv_input_error


def parse_arrow_fit(
    fields: dict[str, str], source: bytes | str, budget: RowBudget | None = None
) -> tuple[FitRequest, dict[str, Any], Callable]:
    """A fit sent as an Arrow IPC stream, its fields as query parameters; errors point at columns (``/score/3``)."""
    fit = form_fit_request(fields)
    holdout, shape = holdout_from_table(read_table(source, "arrow", (), budget), ())
    return fit, holdout, shape.error


def csv_input_error(error: CalibrationInputError) -> Problem:
    """Locate a core validation error in an uploaded CSV (the header is line 1)."""
    column = {"scores": "score", "labels": "label", "sample_weight": "weight"}.get(error.field)
    if column is None:
        return _outside_file(error) or npz_input_error(error)
    where = f"line {error.index[0] + 2}, column {column}" if error.index else f"column {column}"
    return Problem.invalid("/file", f"{where}: {error.detail}")


def npz_input_error(error: CalibrationInputError) -> Problem:
    """Locate a core validation error in an uploaded .npz archive: /file/<array>/<index>."""
    problem = _outside_file(error)
    if problem is not None:
        return problem
    where = "/file/" + error.field + "".join(f"/{i}" for i in error.index or ())
    return Problem.invalid(where, error.detail)


def _outside_file(error: CalibrationInputError) -> Problem | None:
    """Errors about the form's fields (options, input, method) point at those fields."""
    head = error.field.partition(".")[0]
    if head in ("options", "input", "method"):
        return Problem.invalid("/" + error.field.replace(".", "/"), error.detail)
    return None


__all__ = ["Holdout", "csv_input_error", "form_fit_request", "npz_input_error", "parse_arrow_fit", "parse_csv", "parse_upload", "read_form"]
