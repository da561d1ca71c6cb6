"""The row budget of a request, counted before its body is parsed, decompressed or allocated.

A request carries at most a set number of rows (CALIBD_MAX_HOLDOUT_ROWS for a fit or an
evaluation, CALIBD_MAX_FEEDBACK_ROWS for feedback), and a table or archive at most
CALIBD_MAX_DECODED_BYTES once decompressed. Each format is counted from what it declares:

* JSON: the items of each array (and object), counted on the raw text in slices of a
  megabyte, without building a Python value;
* Arrow IPC: each record batch's length and the decompressed size of its buffers, read from
  the message headers before a buffer is decompressed;
* Parquet: the footer's row count;
* .npz: each member's declared size and the shape in its ``.npy`` header (``calibd.api.calibrators.upload``);
* CSV: its lines.

Too many rows is a 422, too many bytes a 413, each naming the field, the limit and its setting.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from starlette.concurrency import run_in_threadpool

from .problems import Problem, pointer


class TooManyRows(Problem):
    """A field holds more rows than the request's budget (422, as every limit on a request's values),
    or its arrays more bytes once decompressed than the upload limit (413, as a body past its limit)."""

    def __init__(self, at: str, detail: str, status: int = 422):
        super().__init__(status, detail, [{"pointer": at, "detail": detail}])

    @classmethod
    def rows(cls, at: str, count: str, limit: int, setting: str) -> TooManyRows:
        return cls(at or "/", f"{count} rows; a request takes at most {limit:,} ({setting})")

    @classmethod
    def decoded(cls, at: str, size: int, limit: int) -> TooManyRows:
        return cls(
            at or "/", f"decompresses to {size:,} bytes; an upload may take at most {limit:,} (CALIBD_MAX_DECODED_BYTES)", 413
        )


@dataclass(frozen=True)
class RowBudget:
    """What one request may carry: ``rows`` (named by its ``setting``), and ``decoded_bytes``."""

    rows: int
    setting: str
    decoded_bytes: int

    def check_json(self, body: bytes) -> None:
        check_json_rows(body, self.rows, self.setting)

    async def check_json_body(self, body: bytes) -> None:
        """``check_json`` in a worker thread when there is counting to do (never for a body with
        fewer commas than the budget's rows)."""
        if len(body) >= 2 * self.rows and body.count(b",") >= self.rows:
            await run_in_threadpool(check_json_rows, body, self.rows, self.setting)

    def check_json_file(self, path: str) -> None:
        """``check_json`` of a spooled body, memory-mapped."""
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size < 2 * self.rows:  # fewer than ``rows`` commas
                return
            problem = None
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                try:
                    check_json_rows(mapped, self.rows, self.setting)
                except TooManyRows as error:  # raised again once the map is closed: its traceback holds views of it
                    problem = TooManyRows(error.errors[0]["pointer"], error.detail)
        if problem is not None:
            raise problem


# -- JSON -------------------------------------------------------------------------------------
_SLICE = 1 << 20
_KEY_BEFORE = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*$')


def check_json_rows(body: bytes | mmap.mmap, limit: int, setting: str) -> None:
    """Raise TooManyRows if an array (or object) of the JSON text ``body`` (any buffer: bytes, a
    memory-mapped file) has more than ``limit`` items.

    A body with fewer commas than ``limit`` passes after one count. Otherwise the items of
    every container are counted on the text, a megabyte at a time (a few megabytes of memory
    whatever the body): commas outside strings, each credited to the innermost open bracket
    before it. Invalid JSON is left for the parser to refuse.
    """
    text = np.frombuffer(body, dtype=np.uint8)
    commas = 0
    for start in range(0, text.size, _SLICE):
        commas += int(np.count_nonzero(text[start:start + _SLICE] == 0x2C))
    if commas < limit:
        return
    scan = _ItemCounter(limit)
    start = 0
    while start < text.size:
        end = min(start + _SLICE, text.size)
        while end < text.size and text[end - 1] == 0x5C:  # never split a run of backslashes
            end += 1
        found = scan.feed(text[start:end], start)
        if found is not None:
            raise TooManyRows.rows(_json_pointer(text, found), f"more than {limit:,}", limit, setting)
        start = end


class _ItemCounter:
    """Counts the commas directly inside each container, slice by slice."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_string = 0
        self.depth = 0
        #: per depth: the position of the last container opened there, and its commas so far
        self.opened: dict[int, int] = {}
        self.commas: dict[int, int] = {}

    def feed(self, text: np.ndarray, offset: int) -> list[int] | None:
        """The positions of the open brackets enclosing a container with too many items
        (outermost first), or None."""
        quote = text == 0x22
        if quote.any() and (text == 0x5C).any():  # a quote after an odd run of backslashes is escaped
            slashes = np.flatnonzero(text == 0x5C)
            breaks = np.flatnonzero(np.diff(slashes) != 1)
            starts, ends = slashes[np.r_[0, breaks + 1]], slashes[np.r_[breaks, slashes.size - 1]]
            after = ends[((ends - starts) % 2 == 0) & (ends + 1 < text.size)] + 1
            quote[after[text[after] == 0x22]] = False
        folded = text & 0xDF  # braces as brackets
        structure = np.flatnonzero((folded == 0x5B) | (folded == 0x5D) | (text == 0x2C))
        if quote.any():  # outside strings: after an even number of quotes (and of strings left open before)
            quotes = np.flatnonzero(quote)
            structure = structure[(np.searchsorted(quotes, structure) & 1) == self.in_string]
            self.in_string ^= quotes.size & 1
        kind = folded[structure]
        opens, closes = kind == 0x5B, kind == 0x5D
        steps = opens.astype(np.int32) - closes
        depth_after = self.depth + np.cumsum(steps, dtype=np.int64)
        if depth_after.size:
            self.depth = int(depth_after[-1])
        commas = ~(opens | closes)
        comma_depth, open_depth = depth_after[commas], depth_after[opens]
        comma_at, open_at = structure[commas], structure[opens]
        levels = np.flatnonzero(np.bincount(np.clip(np.r_[comma_depth, open_depth], 0, None)))
        for level in levels.tolist()[::-1]:  # innermost first: the outer levels still say what encloses it
            starts = open_at[open_depth == level]
            inside = comma_at[comma_depth == level]
            owner = np.searchsorted(starts, inside, side="right")  # 0: the container open before this slice
            counts = np.bincount(owner, minlength=starts.size + 1)
            counts[0] += self.commas.get(level, 0)
            worst = int(counts.argmax())
            if counts[worst] >= self.limit:  # items = commas + 1
                at = self.opened.get(level, -1) if worst == 0 else offset + int(starts[worst - 1])
                return self._ancestors(level, at, open_at, open_depth, offset)
            if starts.size:
                self.opened[level] = offset + int(starts[-1])
                self.commas[level] = int(counts[-1])
            else:
                self.commas[level] = int(counts[0])
        return None

    def _ancestors(self, level: int, at: int, open_at: np.ndarray, open_depth: np.ndarray, offset: int) -> list[int]:
        chain = [at]
        for outer in range(int(level) - 1, 0, -1):
            here = open_at[(open_depth == outer) & (open_at + offset < chain[0])]
            chain.insert(0, offset + int(here[-1]) if here.size else self.opened.get(outer, -1))
        return chain


def _json_pointer(text: np.ndarray, chain: list[int]) -> str:
    """The pointer of the container opened at ``chain[-1]``: the keys before each open bracket, as
    far as the containers are objects (an array inside an array is named by the outer one)."""
    keys: list[str] = []
    for at in chain[1:]:
        match = _KEY_BEFORE.search(text[max(0, at - 300):at].tobytes()) if at > 0 else None
        if match is None:
            break
        try:
            keys.append(str(orjson.loads(b'"' + match.group(1) + b'"')))
        except orjson.JSONDecodeError:
            break
    return pointer(*keys)


# -- Arrow IPC --------------------------------------------------------------------------------
def check_ipc_stream(source: bytes | str, limit: int, max_bytes: int, setting: str, where: tuple[str, ...]) -> None:
    """Raise TooManyRows if an Arrow IPC stream's record batches hold more than ``limit`` rows in
    all, or its buffers more than ``max_bytes`` once decompressed; from the message headers, before
    any buffer is decompressed. A stream pyarrow cannot read is left for ``read_table`` to refuse."""
    stream = pa.memory_map(source) if isinstance(source, str) else pa.BufferReader(source)
    rows = size = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(stream)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                return
            if message.type not in ("record batch", "dictionary batch"):
                continue
            length, decoded = _batch_extent(message.metadata.to_pybytes(), message.body, message.type == "dictionary batch")
            if message.type == "record batch":
                rows += length
            size += decoded
            if rows > limit:
                raise TooManyRows.rows(pointer(*where), f"more than {limit:,}", limit, setting)
            if size > max_bytes:
                raise TooManyRows.decoded(pointer(*where), size, max_bytes)
    except (pa.ArrowException, OSError, struct.error, IndexError, ValueError):
        return


def _u32(data: bytes, at: int) -> int:
    return struct.unpack_from("<I", data, at)[0]


def _field(data: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies, or None if absent."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    size = struct.unpack_from("<H", data, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > size:
        return None
    at = struct.unpack_from("<H", data, vtable + slot)[0]
    return table + at if at else None


def _batch_extent(metadata: bytes, body: pa.Buffer, dictionary: bool) -> tuple[int, int]:
    """(rows, bytes once decompressed) of a record or dictionary batch message (Arrow's
    Message.fbs: Message.header is a RecordBatch, or a DictionaryBatch holding one)."""
    message = _u32(metadata, 0)
    header = _field(metadata, message, 2)
    if header is None:
        return 0, 0
    batch = header + _u32(metadata, header)
    if dictionary:
        data = _field(metadata, batch, 1)
        if data is None:
            return 0, 0
        batch = data + _u32(metadata, data)
    length_at = _field(metadata, batch, 0)
    length = struct.unpack_from("<q", metadata, length_at)[0] if length_at is not None else 0
    compressed = _field(metadata, batch, 3) is not None
    buffers_at = _field(metadata, batch, 2)
    decoded = 0
    if buffers_at is not None:
        vector = buffers_at + _u32(metadata, buffers_at)
        for i in range(_u32(metadata, vector)):
            offset, size = struct.unpack_from("<qq", metadata, vector + 4 + 16 * i)
            if compressed and size >= 8:
                # each compressed buffer starts with its decompressed length (-1: stored as it is)
                declared = struct.unpack("<q", body.slice(offset, 8).to_pybytes())[0]
                decoded += size - 8 if declared < 0 else declared
            else:
                decoded += max(size, 0)
    return max(length, 0), decoded


# -- Parquet ---------------------------------------------------------------------------------
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def check_parquet(file: pq.ParquetFile, budget: RowBudget, where: tuple[str, ...]) -> None:
    """Raise TooManyRows if a Parquet file's footer declares more rows than the budget, or columns
    larger than its decoded bytes (fixed-width values at their width, others at their
    uncompressed size plus an offset each)."""
    metadata = file.metadata
    if metadata.num_rows > budget.rows:
        raise TooManyRows.rows(pointer(*where), f"{metadata.num_rows:,}", budget.rows, budget.setting)
    size = 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for column in range(row_group.num_columns):
            chunk = row_group.column(column)
            width = _WIDTH.get(chunk.physical_type)
            size += chunk.num_values * width if width else chunk.num_values * 8 + chunk.total_uncompressed_size
    if size > budget.decoded_bytes:
        raise TooManyRows.decoded(pointer(*where), size, budget.decoded_bytes)


# -- CSV --------------------------------------------------------------------------------------
def check_csv_rows(content: bytes, limit: int, setting: str, at: str) -> None:
    """Raise TooManyRows if a CSV (with a header line) has more than ``limit`` rows."""
    lines = content.count(b"\n") + 1 - content.count(b"\n\n") - content.count(b"\n\r\n")  # less blank ones
    if lines > limit + 1:
        raise TooManyRows.rows(at, f"more than {limit:,}", limit, setting)


__all__ = ["RowBudget", "TooManyRows", "check_csv_rows", "check_ipc_stream", "check_json_rows", "check_parquet"]
