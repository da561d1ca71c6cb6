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

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..auth import authorize, bearer_token, require
from ..edge import answer_error, asgi_route, read_body, send_json
from ..health import readiness_problem
from ..problems import Problem
from ..state import Services, services_of
from ..validation import json_response, request_body
from . import core, transformer
from .rest_codec import Answer, json_inputs, object_field, read_inputs, request_parameters, respond, split_body
from .schemas import InferenceRequest, InferenceResponse, Live, ModelMetadata, ModelReady, Ready, ServerMetadata

router = APIRouter(prefix="/v2", tags=["inference protocol (v2)"])

REQUIRE_INFER = require("calibrate")
REQUIRE_METADATA = require("calibrate", "read")
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
        services = scope["app"].state.services
        authorization = header_length = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
        authorize(services.keyring, bearer_token(authorization), ("calibrate",))
        body = await read_body(receive, services.settings.max_body_bytes)
        parameters = scope["path_params"]
        payload, length = await _infer(scope["app"], services, body, header_length, parameters["name"], parameters.get("version"))
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
    fastapi_app: Any, services: Services, body: bytes, header_length: str | None, name: str, version: str | None
) -> Answer:
    data, binary = split_body(body, header_length)
    number = core.parse_version(version)
    ids, costs = request_parameters(data)
    if not _has_scores(data):
        predictor = await transformer.predictor_for(services, name)
        if predictor is not None:
            return await _transform(fastapi_app, predictor, name, number, data, binary, ids, costs)
    loaded, outputs = await core.infer(services, name, number, read_inputs(data, binary), ids, costs)
    return respond(data, name, str(loaded.version), outputs)


@router.get("/health/live", summary="Liveness (v2)", responses={200: {"model": Live}})
async def live() -> Response:
    return json_response({"live": True})


@router.get("/health/ready", summary="Readiness (v2): database reachable, migrations at head", responses={200: {"model": Ready}, 503: {}})
async def ready(request: Request) -> Response:
    problem = await readiness_problem(services_of(request))
    if problem is not None:
        raise problem
    return json_response({"ready": True})


@router.get("", summary="Server metadata (v2)", responses={200: {"model": ServerMetadata}})
async def server_metadata() -> Response:
    return json_response(core.server_metadata())


@router.get("/models/{name}", dependencies=[REQUIRE_METADATA], summary="Model metadata (v2)", responses=METADATA)
async def model_metadata(request: Request, name: str) -> Response:
    return json_response(await core.model_metadata(services_of(request), name, None))


@router.get("/models/{name}/versions/{version}", dependencies=[REQUIRE_METADATA], summary="Model version metadata (v2)", responses=METADATA)
async def model_version_metadata(request: Request, name: str, version: str) -> Response:
    return json_response(await core.model_metadata(services_of(request), name, core.parse_version(version)))


@router.get("/models/{name}/ready", dependencies=[REQUIRE_METADATA], summary="Model readiness (v2)", responses=READY)
async def model_ready(request: Request, name: str) -> Response:
    return await _ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready", dependencies=[REQUIRE_METADATA], summary="Model version readiness (v2)", responses=READY)
async def model_version_ready(request: Request, name: str, version: str) -> Response:
    return await _ready(request, name, version)


async def _ready(request: Request, name: str, version: str | None) -> Response:
    if not await core.model_ready(services_of(request), name, core.parse_version(version)):
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
    services = fastapi_app.state.services
    loaded = await services.calibrator(name, version)  # an unknown calibrator is a 404 before any forwarding
    forwarded = {key: value for key, value in data.items() if key != "outputs"}
    # calibd's own parameters stay here; outputs come back as JSON (calibd encodes its own as asked)
    parameters = {k: v for k, v in object_field(data, "parameters", "").items() if k not in ("ids", "costs", "binary_data_output")}
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
            forwarded["inputs"] = json_inputs(data, binary)
        body = orjson.dumps(forwarded, option=orjson.OPT_SERIALIZE_NUMPY)
        answer, answer_binary = await transformer.forward(upstreams, predictor, body)
    passthrough, raw = transformer.predictor_outputs(predictor, answer, answer_binary)
    binary_scores = loaded.n_classes == 2 and "binary" in loaded.calibrator.tasks
    scores = transformer.scores_for(loaded.n_classes, binary_scores, raw)
    scores_input = core.Input("scores", "FP64", scores.shape, scores)
    loaded, outputs = await core.infer(services, name, version, [scores_input], ids, costs)
    passthrough = [(tensor, blob) for tensor, blob in passthrough if tensor.get("name") != "probabilities"]
    return respond(data, name, str(loaded.version), outputs, passthrough)
