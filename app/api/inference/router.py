"""The Open Inference Protocol (KServe v2) over REST: a calibrator is a model.

Health, server and model metadata, model readiness and inference, with the binary tensor data
extension (``Inference-Header-Content-Length``). Errors carry the protocol's ``error`` field
beside calibd's problem fields. Inference needs the ``calibrate`` scope, metadata and readiness
``calibrate`` or ``read``; health is open, as /healthz and /readyz are.

Prediction ids for feedback: ``parameters.ids`` (a list of strings, one per row), or an ``ids``
input of BYTES [n] (the form gRPC clients use). Costs for ``decisions``: ``parameters.costs``, as
in /calibrate (over gRPC, a JSON string).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..auth import authorize, bearer_token, require
from ..edge import answer_error, asgi_route, read_body, send_json
from ..bodies import parse_json_object
from ..health import readiness_problem
from ..problems import Problem
from ..state import Services, services
from ..validation import json_response, request_body
from . import core, transformer
from .schemas import InferenceRequest, InferenceResponse, Live, ModelMetadata, ModelReady, Ready, ServerMetadata
from .tensors import DTYPES, TensorError, check_shape, datatype_of, from_bytes, from_json, to_bytes, to_json_data

router = APIRouter(prefix="/v2", tags=["inference protocol (v2)"])

REQUIRE_INFER = require("calibrate")
REQUIRE_METADATA = require("calibrate", "read")
HEADER_LENGTH = "inference-header-content-length"
#: An answer's body, and the length of its JSON header when binary data follows (else None: all JSON).
Answer = tuple[bytes, "int | None"]
#: Outputs calibd adds; in transformer mode any other requested output is the predictor's.
CALIBD_OUTPUTS = frozenset({"probabilities", "intervals", "accepted", "decisions"})


METADATA = {200: {"model": ModelMetadata}, 404: {}, 409: {}}
READY = {200: {"model": ModelReady}, 404: {}, 409: {}}
INFERENCE = {
    200: {
        "model": InferenceResponse,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        "description": "JSON, or with binary outputs: the JSON header (Inference-Header-Content-Length bytes), then the data",
    },
    404: {},
    409: {},
    413: {},
    422: {},
}
INFERENCE_BODY = request_body(("application/json", InferenceRequest))


def _path(*names: str) -> dict[str, Any]:
    """OpenAPI parameters for path segments the route reads itself, with the request body."""
    parameters = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]
    return {**INFERENCE_BODY, "parameters": parameters}


# Inference first: routes are matched in order, and it is the one on the hot path. A plain ASGI
# endpoint (as /calibrate is), which Edge reaches past the route table.
async def infer(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /v2/models/{name}[/versions/{version}]/infer: key, body, calibration (or the predictor), answer."""
    try:
        app = scope["app"].state.services
        authorization = header_length = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
        authorize(app.keyring, bearer_token(authorization), ("calibrate",))
        body = await read_body(receive, app.settings.max_body_bytes)
        parameters = scope["path_params"]
        payload, length = await _infer(scope["app"], app, body, header_length, parameters["name"], parameters.get("version"))
    except Exception as error:
        await answer_error(scope, receive, send, error)
        return
    if length is None:
        await send_json(send, payload)
    else:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(payload)).encode()), (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(length).encode()),
        ]})
        await send({"type": "http.response.body", "body": payload})


for _path_template, _summary, _parameters in (
    ("/models/{name}/infer", "Inference (v2)", ("name",)),
    ("/models/{name}/versions/{version}/infer", "Inference on a version (v2)", ("name", "version")),
):
    asgi_route(
        router, _path_template, infer, ["POST"], dependencies=[REQUIRE_INFER], summary=_summary,
        responses=INFERENCE, openapi_extra=_path(*_parameters),
    )


async def _infer(
    fastapi_app: Any, app: Services, body: bytes, header_length: str | None, name: str, version: str | None
) -> Answer:
    data, binary = split_body(body, header_length)
    number = core.parse_version(version)
    ids, costs = request_parameters(data)
    if not _has_scores(data):
        predictor = await transformer.predictor_for(app, name)
        if predictor is not None:
            return await _transform(fastapi_app, predictor, name, number, data, binary, ids, costs)
    loaded, outputs = await core.infer(app, name, number, read_inputs(data, binary), ids, costs)
    return respond(data, name, str(loaded.version), outputs)


@router.get("/health/live", summary="Liveness (v2)", responses={200: {"model": Live}})
async def live() -> Response:
    return json_response({"live": True})


@router.get("/health/ready", summary="Readiness (v2): database reachable, migrations at head", responses={200: {"model": Ready}, 503: {}})
async def ready(request: Request) -> Response:
    problem = await readiness_problem(services(request))
    if problem is not None:
        raise problem
    return json_response({"ready": True})


@router.get("", summary="Server metadata (v2)", responses={200: {"model": ServerMetadata}})
async def server_metadata() -> Response:
    return json_response(core.server_metadata())


@router.get("/models/{name}", dependencies=[REQUIRE_METADATA], summary="Model metadata (v2)", responses=METADATA)
async def model_metadata(request: Request, name: str) -> Response:
    return json_response(await core.model_metadata(services(request), name, None))


@router.get("/models/{name}/versions/{version}", dependencies=[REQUIRE_METADATA], summary="Model version metadata (v2)", responses=METADATA)
async def model_version_metadata(request: Request, name: str, version: str) -> Response:
    return json_response(await core.model_metadata(services(request), name, core.parse_version(version)))


@router.get("/models/{name}/ready", dependencies=[REQUIRE_METADATA], summary="Model readiness (v2)", responses=READY)
async def model_ready(request: Request, name: str) -> Response:
    return await _ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", dependencies=[REQUIRE_METADATA], summary="Model version readiness (v2)", responses=READY)
async def model_version_ready(request: Request, name: str, version: str) -> Response:
    return await _ready(request, name, version)


async def _ready(request: Request, name: str, version: str | None) -> Response:
    if not await core.model_ready(services(request), name, core.parse_version(version)):
        raise Problem(409, f"calibrator {name!r} has no current version; promote one or name a version")
    return json_response({"name": name, "ready": True})


def _has_scores(data: dict[str, Any]) -> bool:
    inputs = data.get("inputs")
    if type(inputs) is not list:
        return True  # malformed: read_inputs says how
    for tensor in inputs:
        if type(tensor) is dict and tensor.get("name") == "scores":
            return True
    return False


async def _transform(
    fastapi_app: Any,
    predictor: transformer.Predictor,
    name: str,
    version: int | None,
    data: dict[str, Any],
    binary: memoryview | None,
    ids: list[str] | None,
    costs: Any,
) -> Answer:
    """Transformer mode: the predictor answers the caller's request, calibd calibrates its output."""
    app = fastapi_app.state.services
    loaded = await core.resolve(app, name, version)  # an unknown calibrator is a 404 before any forwarding
    forwarded = {key: value for key, value in data.items() if key != "outputs"}
    # calibd's own parameters stay here; outputs come back as JSON (calibd encodes its own as asked)
    parameters = {k: v for k, v in _object(data, "parameters", "").items() if k not in ("ids", "costs", "binary_data_output")}
    if parameters:
        forwarded["parameters"] = parameters
    else:
        forwarded.pop("parameters", None)
    requested = data.get("outputs")
    if isinstance(requested, list):  # the caller's named outputs, and the one calibd calibrates
        names = [o.get("name") for o in requested if isinstance(o, dict)]
        predictor_side = [n for n in names if n not in CALIBD_OUTPUTS]
        if predictor.output not in names:
            predictor_side.append(predictor.output)
    else:
        predictor_side = [predictor.output]
    upstreams = fastapi_app.state.predictor_client
    if predictor.grpc:
        answer, answer_binary = await transformer.forward_grpc(upstreams, predictor, forwarded, read_inputs(data, binary), predictor_side), None
    else:
        forwarded["outputs"] = [{"name": n} for n in predictor_side]
        if binary is not None:  # as JSON: not every model server takes binary inputs (MLServer does not)
            forwarded["inputs"] = _json_inputs(data, binary)
        body = orjson.dumps(forwarded, option=orjson.OPT_SERIALIZE_NUMPY)
        answer, answer_binary = await transformer.forward(upstreams, predictor, body)
    passthrough, raw = transformer.predictor_outputs(predictor, answer, answer_binary)
    binary_scores = loaded.n_classes == 2 and "binary" in loaded.calibrator.tasks
    scores = transformer.scores_for(loaded.n_classes, binary_scores, raw)
    scores_input = core.Input("scores", "FP64", scores.shape, scores)
    loaded, outputs = await core.infer(app, name, version, [scores_input], ids, costs)
    passthrough = [(tensor, blob) for tensor, blob in passthrough if tensor.get("name") != "probabilities"]
    return respond(data, name, str(loaded.version), outputs, passthrough)


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
    parameters = _object(data, "parameters", "")
    return parameters.get("ids"), parameters.get("costs")


def _object(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
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
        size = _object(tensor, "parameters", where).get("binary_data_size")
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


def _json_inputs(data: dict[str, Any], binary: memoryview) -> list[dict[str, Any]]:
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
    binary_default = _flag(_object(data, "parameters", ""), "binary_data_output", "/parameters", False)
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
            flags = _object(output, "parameters", where)
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
