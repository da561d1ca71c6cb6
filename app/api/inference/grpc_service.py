"""``inference.GRPCInferenceService`` on a second port, in the serving process's own event loop.

The same calibrators, keys and batch step as the REST routes (``calibd.api.inference.core``): the
key comes from the ``authorization: Bearer <key>`` metadata; errors map onto gRPC status codes.
Inputs come as ``raw_input_contents`` (what tritonclient sends) or typed ``contents``; outputs go
back as ``raw_output_contents``. Prediction ids: an ``ids`` input (BYTES [n]); costs: the
``costs`` parameter, a JSON string.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import orjson
from fastapi import FastAPI

from ...grpc_v2 import (
    SERVICE,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelReadyRequest,
    ModelReadyResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from ...storage.repository import NoCurrentVersion, NotFound
from ..auth import authorize
from ..health import readiness_problem
from ..problems import Problem
from ..state import Services
from . import core
from .tensors import DTYPES, TensorError, check_shape, datatype_of, from_bytes, from_contents, to_bytes

logger = logging.getLogger("calibd")

#: calibd's statuses as gRPC codes.
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

class InferenceService:
    def __init__(self, app: FastAPI):
        self.app = app

    @property
    def services(self) -> Services:
        return self.app.state.services

    def _authorize(self, context: grpc.aio.ServicerContext, *scopes: str) -> None:
        key = None
        for name, value in context.invocation_metadata() or ():
            if name == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                key = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        authorize(self.services.keyring, key, scopes)

    async def server_live(self, request, context) -> Any:
        return ServerLiveResponse(live=True)

    async def server_ready(self, request, context) -> Any:
        return ServerReadyResponse(ready=await readiness_problem(self.services) is None)

    async def server_metadata(self, request, context) -> Any:
        return ServerMetadataResponse(**core.server_metadata())

    async def model_ready(self, request, context) -> Any:
        self._authorize(context, "calibrate", "read")
        try:
            ready = await core.model_ready(self.services, request.name, core.parse_version(request.version))
        except (NotFound, NoCurrentVersion):
            ready = False
        except Problem as problem:
            if problem.status != 404:
                raise
            ready = False
        return ModelReadyResponse(ready=ready)

    async def model_metadata(self, request, context) -> Any:
        self._authorize(context, "calibrate", "read")
        metadata = await core.model_metadata(self.services, request.name, core.parse_version(request.version))
        return ModelMetadataResponse(**metadata)

    async def model_infer(self, request, context) -> Any:
        self._authorize(context, "calibrate")
        costs = None
        if "costs" in request.parameters:
            try:
                costs = orjson.loads(request.parameters["costs"].string_param)
            except orjson.JSONDecodeError:
                raise TensorError("/parameters/costs", "costs are a JSON string over gRPC") from None
        loaded, outputs = await core.infer(
            self.services, request.model_name, core.parse_version(request.model_version), read_inputs(request), None, costs
        )
        available = dict(outputs)
        names = [output.name for output in request.outputs] or [name for name, _ in outputs]
        response = ModelInferResponse(model_name=request.model_name, model_version=str(loaded.version), id=request.id)
        for position, name in enumerate(names):
            if name not in available:
                raise TensorError(f"/outputs/{position}", f"outputs are among {sorted(available)}")
            value = available[name]
            response.outputs.add(name=name, datatype=datatype_of(value), shape=value.shape)
            response.raw_output_contents.append(to_bytes(value))
        return response


def read_inputs(request: Any) -> list[core.Input]:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise TensorError("/raw_input_contents", f"has {len(raw)} entries for {len(request.inputs)} inputs")
    inputs = []
    for position, tensor in enumerate(request.inputs):
        where = f"/inputs/{position}"
        datatype = tensor.datatype
        if datatype not in DTYPES and datatype != "BYTES":
            raise TensorError(where + "/datatype", f"{datatype!r} is not a datatype of the protocol")
        shape = check_shape(list(tensor.shape), where)
        if raw:
            value = from_bytes(raw[position], datatype, shape, where)
            if datatype == "FP32":  # calibrated in float64, as over REST
                value = value.astype("<f8")
        else:
            value = from_contents(tensor.contents, datatype, shape, where)
        inputs.append(core.Input(tensor.name, datatype, shape, value))
    return inputs


def _status(error: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(error, Problem):
        return CODES.get(error.status, grpc.StatusCode.UNKNOWN), error.detail
    if isinstance(error, NotFound):
        return grpc.StatusCode.NOT_FOUND, str(error)
    if isinstance(error, NoCurrentVersion):
        return grpc.StatusCode.FAILED_PRECONDITION, str(error)
    logger.exception("unhandled error in a gRPC call")
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"


def _handler(method, request_type, response_type):
    async def call(request, context):
        try:
            return await method(request, context)
        except Exception as error:  # noqa: BLE001 - every error becomes a status
            code, detail = _status(error)
        await context.abort(code, detail)

    return grpc.unary_unary_rpc_method_handler(
        call, request_deserializer=request_type.FromString, response_serializer=response_type.SerializeToString
    )


def handlers(service: InferenceService) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ServerLive": _handler(service.server_live, ServerLiveRequest, ServerLiveResponse),
            "ServerReady": _handler(service.server_ready, ServerReadyRequest, ServerReadyResponse),
            "ServerMetadata": _handler(service.server_metadata, ServerMetadataRequest, ServerMetadataResponse),
            "ModelReady": _handler(service.model_ready, ModelReadyRequest, ModelReadyResponse),
            "ModelMetadata": _handler(service.model_metadata, ModelMetadataRequest, ModelMetadataResponse),
            "ModelInfer": _handler(service.model_infer, ModelInferRequest, ModelInferResponse),
        },
    )


async def start(app: FastAPI, host: str, port: int, max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
    """Serve the inference service on ``host:port`` (0: any free port) in the running event loop.

    Several worker processes may each start one on the same port: gRPC binds with SO_REUSEPORT,
    and the kernel spreads connections over them as it does uvicorn's.
    """
    options = [("grpc.max_receive_message_length", max_message_bytes), ("grpc.max_send_message_length", max_message_bytes)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((handlers(InferenceService(app)),))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound
