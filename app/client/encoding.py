"""How arrays, names and uploaded files go over the wire."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, BinaryIO
from urllib.parse import quote

import numpy as np
import orjson

def jsonable(value: Any) -> Any:
    """Arrays as orjson serialises them fast (numeric, contiguous), anything else as lists.

    orjson writes NaN and infinity as null; the service would then only say that an array
    holds something other than numbers. Such arrays are written with NaN/Infinity literals
    instead, which the service parses in order to point at the element (``/scores/3``).
    """
    if value is None or isinstance(value, (str, bytes, int, float, bool, dict)):
        return value
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind in "biuf" and array.dtype.byteorder in "=|<" and array.dtype.itemsize <= 8:
        if array.dtype.kind == "f":
            if array.dtype != np.float64 and array.dtype != np.float32:
                array = array.astype(np.float64)
            if not np.isfinite(array).all():
                return orjson.Fragment(json.dumps(array.tolist()))
        return np.ascontiguousarray(array)
    return array.tolist()


def jsonable_arrays(values: dict[str, Any]) -> dict[str, Any]:
    return {key: jsonable(value) for key, value in values.items()}


def quoted_name(name: str) -> str:
    return quote(str(name), safe="")


#: Content types of uploaded holdout files, by suffix (the service also knows them by their first bytes).
UPLOAD_TYPES = {".npz": "application/octet-stream", ".parquet": "application/vnd.apache.parquet"}


class ProgressReader:
    """A file whose reads are reported (upload progress); httpx still sees its size and can rewind it."""

    def __init__(self, file: BinaryIO, total: int, report: Callable[[int, int], None] | None):
        self._file = file
        self._total = total
        self._report = report
        self._sent = 0

    def fileno(self) -> int:
        return self._file.fileno()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        position = self._file.seek(offset, whence)
        if whence == 0 and offset == 0:
            self._sent = 0
        return position

    def close(self) -> None:
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._sent += len(chunk)
        if self._report is not None and chunk:
            self._report(self._sent, self._total)
        return chunk


#: Called with (stage, fraction done or None, seconds left or None). Stages: "upload" (per chunk
#: sent), "fit" (uploaded; the synchronous fit runs), and a fit job's states ("queued", "running").
Progress = Callable[[str, float | None, float | None], None]
