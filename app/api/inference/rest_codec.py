"""The inference protocol's REST codec: a request body (JSON, with binary tensor data after it) to
inputs and parameters, and outputs back to a response body.

The routes (``router.py``) and the transformer use it; the rules are the KServe v2 REST protocol's
(https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/), with binary tensor
data as Triton's extension defines it (``inference-header-content-length``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ..bodies import parse_json_object
from ..problems import Problem
from . import core
from .tensors import DTYPES, TensorError, check_shape, datatype_of, from_bytes, from_json, to_bytes, to_json_data

HEADER_LENGTH = "inference-header-content-length"

#: A response body, and the length of its JSON header when binary data follows it (else None).
Answer = tuple[bytes, "int | None"]


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview | None]:
    """The JSON inference header, and the binary tensor data after it (if any)."""
    if header_length is None:
        return parse_json_object(body), None
    if not header_length.isdigit() or int(header_length) > len(body):
        raise Problem(400, f"Inference-Header-Content-Length {header_length!r} is not a length within the body ({len(body)} bytes)")
    length = int(header_length)
    return parse_json_object(body[:length]), memoryview(body)[length:]


def request_parameters(data: dict[str, Any]) -> tuple[list[str] | None, Any]:
    if not isinstance(data.get("id", ""), (str, type(None))):
        raise TensorError("/id", "must be a string")
    parameters = object_field(data, "parameters", "")
    return parameters.get("ids"), parameters.get("costs")


def object_field(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``data[key]``: an object, or {} when absent or null."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TensorError(f"{where}/{key}", "must be an object")
    return value


def _flag(data: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if type(value) is not bool:
        raise TensorError(f"{where}/{key}", "must be true or false")
    return value


def read_inputs(data: dict[str, Any], binary: memoryview | None) -> list[core.Input]:
    """The request's input tensors, from their JSON ``data`` or their slice of the binary data."""
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise TensorError("/inputs", "must be a non-empty list of tensors")
    offset = 0
    tensors = []
    for position, tensor in enumerate(inputs):
        where = f"/inputs/{position}"
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise TensorError(where, "a tensor is an object with a name, datatype, shape and data")
        datatype = tensor.get("datatype")
        if not isinstance(datatype, str) or (datatype not in DTYPES and datatype != "BYTES"):
            raise TensorError(where + "/datatype", f"{datatype!r} is not a datatype of the protocol")
        shape = check_shape(tensor.get("shape"), where)
        size = object_field(tensor, "parameters", where).get("binary_data_size")
        if size is not None:
            if "data" in tensor:
                raise TensorError(where + "/data", "give either data or parameters.binary_data_size, not both")
            if binary is None or type(size) is not int or size < 0 or offset + size > len(binary):
                raise TensorError(where + "/parameters/binary_data_size", "points past the binary data of the body")
            value = from_bytes(binary[offset : offset + size], datatype, shape, where)
            if datatype == "FP32":  # calibrated in float64, as the same numbers sent as JSON are
                value = value.astype("<f8")
            offset += size
        else:
            value = from_json(tensor.get("data"), datatype, shape, where)
        tensors.append(core.Input(tensor["name"], datatype, shape, value))
    if binary is not None and offset != len(binary):
        raise Problem(400, f"the body has {len(binary) - offset} bytes of binary data that no input claims")
    return tensors


def json_inputs(data: dict[str, Any], binary: memoryview) -> list[dict[str, Any]]:
    """The request's input tensors with their binary data written out as JSON ``data``."""
    tensors = []
    for tensor, parsed in zip(data["inputs"], read_inputs(data, binary)):
        plain = {key: value for key, value in tensor.items() if key != "parameters"}
        parameters = {k: v for k, v in (tensor.get("parameters") or {}).items() if k != "binary_data_size"}
        if parameters:
            plain["parameters"] = parameters
        plain["data"] = to_json_data(tensors_value(parsed))
        tensors.append(plain)
    return tensors


def tensors_value(parsed: core.Input) -> Any:
    if parsed.datatype == "BYTES":
        return np.array([v.decode() if isinstance(v, bytes) else v for v in parsed.value], dtype=object)
    return np.asarray(parsed.value)


def respond(
    data: dict[str, Any],
    name: str,
    version: str,
    outputs: list[tuple[str, Any]],
    passthrough: list[tuple[dict[str, Any], bytes | None]] = (),
) -> Answer:
    """The inference response: the outputs asked for (all by default), each as JSON or binary data;
    its body, and the length of its JSON header if binary data follows.

    ``passthrough``: a predictor's outputs in transformer mode, sent on as they came, before
    calibd's own (of which ``probabilities`` is always sent there).
    """
    binary_default = _flag(object_field(data, "parameters", ""), "binary_data_output", "/parameters", False)
    requested = data.get("outputs")
    if requested is None and not passthrough and not binary_default:  # the common answer: every output, as JSON
        tensors = [
            {"name": output, "datatype": datatype_of(value), "shape": list(value.shape), "data": to_json_data(value)}
            for output, value in outputs
        ]
        return _header(data, name, version, tensors), None
    available = dict(outputs)
    if requested is None:
        chosen = [(output, binary_default) for output, _ in outputs]
    else:
        if not isinstance(requested, list):
            raise TensorError("/outputs", "must be a list")
        chosen = []
        for position, output in enumerate(requested):
            where = f"/outputs/{position}"
            if not isinstance(output, dict) or not isinstance(output.get("name"), str):
                raise TensorError(where, f"outputs are among {sorted(available)}")
            if output["name"] not in available:
                if passthrough:
                    continue  # the predictor's
                raise TensorError(where, f"outputs are among {sorted(available)}")
            flags = object_field(output, "parameters", where)
            chosen.append((output["name"], _flag(flags, "binary_data", where + "/parameters", binary_default)))
        if passthrough and "probabilities" not in [output for output, _ in chosen]:
            chosen.insert(0, ("probabilities", binary_default))
    tensors, blobs = [], []
    for tensor, blob in passthrough:
        tensors.append(tensor)
        if blob is not None:
            blobs.append(blob)
    for output, as_binary in chosen:
        value = available[output]
        tensor: dict[str, Any] = {"name": output, "datatype": datatype_of(value), "shape": list(value.shape)}
        if as_binary:
            blob = to_bytes(value)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            tensor["data"] = to_json_data(value)
        tensors.append(tensor)
    header = _header(data, name, version, tensors)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def _header(data: dict[str, Any], name: str, version: str, tensors: list[dict[str, Any]]) -> bytes:
    body: dict[str, Any] = {"model_name": name, "model_version": version}
    if data.get("id") is not None:
        body["id"] = data["id"]
    body["outputs"] = tensors
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
