"""Tensors of the Open Inference Protocol (KServe v2): datatypes, JSON and binary encodings.

Shared by the REST routes and the gRPC service. A tensor's data is row-major; over REST it is
either a JSON list (flat or nested) or, with the binary tensor data extension, raw little-endian
bytes after the JSON header (``BYTES`` elements each prefixed by a 4-byte little-endian length).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ...inputs import NOT_A_BOOLEAN, boolean_index, may_hold_booleans

from ..bodies import float_array
from ..problems import Problem

#: The protocol's numeric datatypes as little-endian numpy dtypes.
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
FLOATS = ("FP32", "FP64")
#: Where each datatype's values sit in InferTensorContents.
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

MAX_DIMENSIONS = 8


class TensorError(Problem):
    """A malformed tensor: 400 (the request is not a valid inference request), naming the input."""

    def __init__(self, where: str, detail: str):
        super().__init__(400, f"{where}: {detail}", [{"pointer": where, "detail": detail}])


def check_shape(shape: Any, where: str) -> tuple[int, ...]:
    if isinstance(shape, (list, tuple)) and 0 < len(shape) <= MAX_DIMENSIONS:
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return tuple(shape)
    raise TensorError(where + "/shape", f"must be a list of 1 to {MAX_DIMENSIONS} non-negative integers")


def elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def from_bytes(raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], where: str) -> Any:
    """A tensor's raw bytes as an array of ``shape`` (numeric) or a list of bytes (``BYTES``)."""
    if datatype == "BYTES":
        items, offset, view = [], 0, memoryview(raw)
        while offset < len(view):
            if offset + 4 > len(view):
                raise TensorError(where, "BYTES data ends inside an element's length")
            (length,) = struct.unpack_from("<I", view, offset)
            offset += 4
            if offset + length > len(view):
                raise TensorError(where, "BYTES data ends inside an element")
            items.append(bytes(view[offset : offset + length]))
            offset += length
        if len(items) != elements(shape):
            raise TensorError(where, f"has {len(items)} BYTES elements but shape {list(shape)} needs {elements(shape)}")
        return items
    dtype = DTYPES[datatype]
    if len(raw) != elements(shape) * dtype.itemsize:
        raise TensorError(where, f"has {len(raw)} bytes but shape {list(shape)} of {datatype} needs {elements(shape) * dtype.itemsize}")
    return np.frombuffer(raw, dtype).reshape(shape)


def from_json(data: Any, datatype: str, shape: tuple[int, ...], where: str) -> Any:
    """A tensor's JSON ``data`` (flat or nested, row-major) checked against its shape.

    Floats, flat or in rows, are packed into a float64 array as /calibrate packs its scores
    (``float_array``), except a short flat list, returned as it is for the calibrators' list
    fast path; anything else goes through numpy into an array of ``shape``. ``BYTES`` data
    comes back as a list of strings.
    """
    if not isinstance(data, list):
        raise TensorError(where + "/data", "must be a list")
    if datatype == "BYTES":
        flat = _flatten(data, where)
        if not all(isinstance(item, str) for item in flat):
            raise TensorError(where + "/data", "BYTES elements in JSON are strings")
        if len(flat) != elements(shape):
            raise TensorError(where + "/data", f"has {len(flat)} elements but shape {list(shape)} needs {elements(shape)}")
        return flat
    if datatype in FLOATS and len(shape) <= 2:
        packed = float_array(data)
        if packed is not None and packed.shape == shape:
            return packed.astype(np.float32).astype(np.float64) if datatype == "FP32" else packed
        if datatype == "FP64" and len(shape) == 1 and len(data) == shape[0] and (not data or type(data[0]) is not list):
            # kept as a list for the calibrators' fast path, but a boolean is refused here (400) as in
            # every other tensor, not by the calibrator (422)
            at = next((i for i, value in enumerate(data) if type(value) is bool), None)
            if at is not None:
                raise TensorError(f"{where}/data/{at}", f"{NOT_A_BOOLEAN} ({datatype})")
            return data
    try:
        array = np.asarray(data, dtype=np.float64 if datatype in FLOATS else DTYPES[datatype])
    except (TypeError, ValueError, OverflowError):
        raise TensorError(where + "/data", f"is not a (rectangular) list of {datatype} numbers") from None
    if array.size != elements(shape):
        raise TensorError(where + "/data", f"has {array.size} elements but shape {list(shape)} needs {elements(shape)}")
    if datatype != "BOOL" and array.size and may_hold_booleans(array):  # numpy reads true and false as 1 and 0
        at = boolean_index(data, array.ndim) if array.ndim <= 2 else None
        if at is not None or (array.ndim > 2 and bool in set(map(type, _flatten(data, where)))):
            raise TensorError(where + "/data" + "".join(f"/{i}" for i in at or ()), f"{NOT_A_BOOLEAN} ({datatype})")
    if datatype == "FP32":  # the value a binary FP32 tensor would carry
        array = array.astype(np.float32).astype(np.float64)
    return array.reshape(shape)


def _flatten(data: list, where: str) -> list:
    flat: list = []
    for item in data:
        if isinstance(item, list):
            flat += _flatten(item, where)
        else:
            flat.append(item)
    return flat


_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def datatype_of(value: np.ndarray) -> str:
    dtype = value.dtype
    name = _NAMES.get(dtype)  # native little-endian dtypes compare equal to the protocol's
    if name is not None:
        return name
    if dtype.kind in "OUS":
        return "BYTES"
    return _NAMES.get(dtype.newbyteorder("<"), "FP64")


def as_tensor(value: Any) -> np.ndarray:
    """An output value (array, or a list of decisions) as an array of a protocol datatype."""
    array = np.asarray(value)
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "f":
        return array.astype(np.float64, copy=False)
    if array.dtype.kind in "US":
        return array.astype(object)
    return array


def to_bytes(array: np.ndarray) -> bytes:
    """An output's raw bytes: little-endian numbers, or length-prefixed ``BYTES`` elements."""
    if array.dtype.kind == "O":
        parts = []
        for item in array.ravel():
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()


def to_json_data(array: np.ndarray) -> Any:
    """An output's JSON ``data``: flat, row-major (orjson writes a float64 array exactly)."""
    if array.dtype.kind == "O":
        return [item.decode() if isinstance(item, bytes) else item for item in array.ravel().tolist()]
    return np.ascontiguousarray(array).ravel()  # a view: orjson writes it faster than the array itself


def from_contents(contents: Any, datatype: str, shape: tuple[int, ...], where: str) -> Any:
    """A gRPC tensor's typed ``contents`` (FP32 widened to float64, as calibd calibrates it)."""
    if datatype not in CONTENTS:
        raise TensorError(where + "/contents", f"{datatype} tensors come as raw contents only")
    values = getattr(contents, CONTENTS[datatype])
    if len(values) != elements(shape):
        raise TensorError(where + "/contents", f"has {len(values)} elements but shape {list(shape)} needs {elements(shape)}")
    if datatype == "BYTES":
        return list(values)
    array = np.array(values, dtype=DTYPES[datatype]).reshape(shape)
    return array.astype(np.float64) if datatype == "FP32" else array
