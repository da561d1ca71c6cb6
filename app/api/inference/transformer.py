"""Transformer mode: calibd in front of a model server that speaks the inference protocol.

A calibrator with a predictor takes ``/v2/models/{name}/infer`` requests without a ``scores``
input as the predictor's own requests: they are forwarded, the predictor's named output
(probabilities or logits) is calibrated by /calibrate's batch step, and the caller gets the
predictor's outputs with the calibrated ``probabilities`` added. ``parameters.ids`` log the
calibrated predictions for feedback, as on any /v2 request.

A calibrator's predictor is, first, the one stored with it (PUT /calibrators/{name}/predictor),
then its entry in CALIBD_PREDICTORS, then the CALIBD_PREDICTOR_URL default of ``calibd serve
--predictor``. An ``http(s)://`` predictor is sent the request as JSON (binary inputs written
out, since not every model server takes them); a ``grpc://host:port`` one gets a ModelInfer with
``raw_input_contents``, and its outputs come back to the caller as JSON tensors.

One pool keeps the connections to REST predictors alive, bounded in number (``keepalive``); each
gRPC predictor has one channel (one HTTP/2 connection, requests multiplexed on it). Both connect
only to addresses CALIBD_PREDICTOR_ALLOW permits, checked when the name is resolved, and both cap
the size of an answer (CALIBD_PREDICTOR_MAX_ANSWER_BYTES). Every request is bounded in time.

The predictor's failures are 502 (an error, no answer, an answer too large or not allowed) or 504
(too slow). The caller gets a short reason and an error id; what the predictor said, and its URL,
go to calibd's log under that id (logger ``calibd.predictor``), never to the caller, whose key may
not be the one that set the predictor. calibd's own errors stay 4xx.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import orjson
from starlette.concurrency import run_in_threadpool

from ...config import Settings
from ...grpc_v2 import SERVICE, ModelInferRequest, ModelInferResponse
from ..problems import Problem
from ..state import Services
from . import keepalive
from .tensors import DTYPES, check_shape, from_bytes, from_contents, to_bytes, to_json_data

logger = logging.getLogger("calibd.predictor")

#: Where a predictor came from, most binding first.
STORED, NAMED, DEFAULT = "calibrator", "CALIBD_PREDICTORS", "CALIBD_PREDICTOR_URL"


@dataclass(frozen=True)
class Predictor:
    """Where a calibrator's model is served: the server's URL, the model, the output to calibrate,
    and which setting named it."""

    url: str
    model: str
    output: str
    source: str = STORED

    @property
    def grpc(self) -> bool:
        return self.url.startswith("grpc://")

    def infer_url(self) -> str:
        return f"{self.url.rstrip('/')}/v2/models/{self.model}/infer"

    @property
    def where(self) -> str:
        """The upstream, as errors name it."""
        return f"{self.url} (ModelInfer of {self.model})" if self.grpc else self.infer_url()

    def as_json(self) -> dict[str, str]:
        return {"url": self.url, "model": self.model, "output": self.output, "source": self.source}


def choose(settings: Settings, name: str, stored: dict[str, Any] | None) -> Predictor | None:
    """The calibrator's predictor: the one stored with it, else its CALIBD_PREDICTORS entry, else the default."""
    if stored is not None:
        return Predictor(stored["url"], stored.get("model") or name, stored.get("output") or settings.predictor_output, STORED)
    own = settings.predictors.get(name)
    if own is not None:
        return Predictor(own.url, own.model or name, own.output or settings.predictor_output, NAMED)
    if settings.predictor_url:
        return Predictor(settings.predictor_url, name, settings.predictor_output, DEFAULT)
    return None


async def predictor_for(services: Services, name: str) -> Predictor | None:
    """The predictor a /v2 infer request without scores goes to (from memory once the registry is read)."""
    store = services.store
    stored = store.predictor(name) if store.predictors_known else await run_in_threadpool(store.predictor, name)
    return choose(services.settings, name, stored)


def failure(predictor: Predictor, status: int, reason: str, detail: str = "") -> Problem:
    """The caller's 502/504: ``reason`` (short, calibd's own words) and an error id; the detail
    (what the predictor said) and where it is go to the log under that id."""
    error_id = secrets.token_hex(6)
    logger.warning(
        "predictor error %s: %s (%s)%s", error_id, reason, predictor.where, f": {detail}" if detail else "",
        extra={"error_id": error_id, "predictor": predictor.where, "detail": detail},
    )
    return Problem(status, f"{reason} (error id {error_id})")


class Upstreams:
    """The pooled connections to every predictor: an HTTP client for REST ones, a channel per gRPC one."""

    def __init__(self, settings: Settings):
        self.allow = settings.allowed_predictors()
        self.max_answer = settings.predictor_max_answer_bytes
        self.http = keepalive.Pool(
            settings.predictor_max_connections, settings.predictor_timeout_seconds, self.allow, self.max_answer
        )
        self.timeout = settings.predictor_timeout_seconds
        self._message_bytes = settings.max_body_bytes
        self._channels: dict[str, tuple[grpc.aio.Channel, Any]] = {}
        self._opening = asyncio.Lock()
        self._closing: set[asyncio.Task] = set()

    async def model_infer(self, target: str) -> Any:
        """The ModelInfer call on the target's channel (``host:port``), opened on first use and kept.
        The channel is given the allowed addresses the host resolved to, not the name, so that
        gRPC's own resolver never picks another. Raises keepalive.NotAllowed, or OSError."""
        entry = self._channels.get(target)
        if entry is None:
            async with self._opening:
                entry = self._channels.get(target) or await self._open(target)
        return entry[1]

    async def _open(self, target: str) -> tuple[grpc.aio.Channel, Any]:
        host, _, port_text = target.rpartition(":")
        host, port = host.strip("[]"), int(port_text)
        addresses = await keepalive.resolve(host, port)
        allowed = self.allow.connectable(host, port, addresses)
        if not allowed:
            raise keepalive.NotAllowed(f"{host} resolves to {', '.join(addresses)}, none allowed by CALIBD_PREDICTOR_ALLOW")
        family = allowed[0].version  # one resolver scheme per channel: ipv4: or ipv6:
        pinned = [a for a in allowed if a.version == family]
        scheme = "ipv4:" + ",".join(f"{a}:{port}" for a in pinned) if family == 4 else "ipv6:" + ",".join(f"[{a}]:{port}" for a in pinned)
        limit = self._message_bytes
        channel = grpc.aio.insecure_channel(scheme, options=[
            ("grpc.max_receive_message_length", self.max_answer), ("grpc.max_send_message_length", limit),
            ("grpc.default_authority", target), ("grpc.enable_http_proxy", 0),
        ])
        call = channel.unary_unary(
            f"/{SERVICE}/ModelInfer",
            request_serializer=ModelInferRequest.SerializeToString,
            response_deserializer=ModelInferResponse.FromString,
        )
        entry = self._channels[target] = (channel, call)
        return entry

    def forget(self, target: str) -> None:
        """Drop a channel whose predictor is unavailable, so that the next request resolves its name
        again (its calls in flight have the timeout to finish)."""
        entry = self._channels.pop(target, None)
        if entry is not None:
            task = asyncio.ensure_future(entry[0].close(grace=self.timeout))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self.http.close()
        for channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()


def make_client(settings: Settings) -> Upstreams:
    return Upstreams(settings)


async def forward(upstreams: Upstreams, predictor: Predictor, body: bytes) -> tuple[dict, memoryview | None]:
    """Send the caller's request (JSON) to a REST predictor; its response's JSON header and binary data."""
    try:
        status, length, content = await upstreams.http.post(predictor.infer_url(), body)
    except TimeoutError:
        raise failure(predictor, 504, "the predictor did not answer in time") from None
    except keepalive.NotAllowed as error:
        raise failure(predictor, 502, "the predictor's address is not allowed (CALIBD_PREDICTOR_ALLOW)", str(error)) from None
    except keepalive.TooLarge as error:
        raise failure(predictor, 502, f"the predictor's answer is larger than {upstreams.max_answer} bytes", str(error)) from None
    except OSError as error:
        raise failure(predictor, 502, "the predictor could not be reached", f"{type(error).__name__}: {error}") from None
    if status != 200:
        raise failure(predictor, 502, f"the predictor answered HTTP {status}", _error_text(content))
    try:
        if length is None:
            return orjson.loads(content), None
        return orjson.loads(content[: int(length)]), memoryview(content)[int(length) :]
    except (ValueError, orjson.JSONDecodeError):
        raise failure(predictor, 502, "the predictor's answer is not an inference response", _error_text(content)) from None


async def forward_grpc(
    upstreams: Upstreams, predictor: Predictor, data: dict[str, Any], inputs: list[Any], outputs: list[str]
) -> dict[str, Any]:
    """Send the caller's request to a gRPC predictor as a ModelInfer (inputs as raw contents);
    its response as the JSON header of a REST response, each output's data written out."""
    request = ModelInferRequest(model_name=predictor.model, id=data.get("id") or "")
    _parameters(request.parameters, data.get("parameters"))
    for tensor, parsed in zip(data["inputs"], inputs):
        sent = request.inputs.add(name=parsed.name, datatype=parsed.datatype, shape=parsed.shape)
        _parameters(sent.parameters, tensor.get("parameters"))
        value = parsed.value
        if parsed.datatype == "BYTES":
            value = np.array([v if isinstance(v, bytes) else v.encode() for v in value], dtype=object)
        else:  # the caller's own datatype (calibd reads FP32 as float64; the values are exact in FP32)
            value = np.asarray(value).astype(DTYPES[parsed.datatype], copy=False)
        request.raw_input_contents.append(to_bytes(value))
    for output in outputs:
        request.outputs.add(name=output)
    target = predictor.url.removeprefix("grpc://")
    try:
        async with asyncio.timeout(upstreams.timeout):
            call = await upstreams.model_infer(target)
    except TimeoutError:
        raise failure(predictor, 504, "the predictor did not answer in time", "resolving its name") from None
    except keepalive.NotAllowed as error:
        raise failure(predictor, 502, "the predictor's address is not allowed (CALIBD_PREDICTOR_ALLOW)", str(error)) from None
    except (OSError, ValueError) as error:  # socket.gaierror: the name does not resolve
        raise failure(predictor, 502, "the predictor could not be reached", f"{type(error).__name__}: {error}") from None
    try:
        response = await call(request, timeout=upstreams.timeout)
    except grpc.aio.AioRpcError as error:
        code = error.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise failure(predictor, 504, "the predictor did not answer in time") from None
        if code == grpc.StatusCode.UNAVAILABLE:
            upstreams.forget(target)
            raise failure(predictor, 502, "the predictor could not be reached", error.details() or "") from None
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (error.details() or ""):
            raise failure(predictor, 502, f"the predictor's answer is larger than {upstreams.max_answer} bytes", error.details()) from None
        raise failure(predictor, 502, f"the predictor answered {code.name}", error.details() or "") from None
    return _grpc_header(predictor, response)


def _parameters(target: Any, given: Any) -> None:
    """The caller's scalar parameters as InferParameters (lists, such as ``ids``, stay with calibd)."""
    if not isinstance(given, dict):
        return
    for key, value in given.items():
        if key == "binary_data_size":
            continue
        if type(value) is bool:
            target[key].bool_param = value
        elif type(value) is int and -(2**63) <= value < 2**63:
            target[key].int64_param = value
        elif isinstance(value, str):
            target[key].string_param = value


def _grpc_header(predictor: Predictor, response: Any) -> dict[str, Any]:
    raw = response.raw_output_contents
    if raw and len(raw) != len(response.outputs):
        raise failure(predictor, 502, "the predictor's answer is malformed", f"{len(raw)} raw contents for {len(response.outputs)} outputs")
    outputs = []
    for position, tensor in enumerate(response.outputs):
        where = f"/outputs/{position}"
        try:
            shape = check_shape(list(tensor.shape), where)
            if raw:
                value = from_bytes(raw[position], tensor.datatype, shape, where)
            else:
                value = from_contents(tensor.contents, tensor.datatype, shape, where)
        except (Problem, KeyError) as error:
            detail = getattr(error, "detail", f"datatype {tensor.datatype!r}")
            raise failure(predictor, 502, f"the predictor's output {position} is malformed", detail) from None
        if tensor.datatype == "BYTES":
            value = np.array(value, dtype=object)
        elif tensor.datatype == "FP32":
            value = value.astype(np.float32, copy=False)  # as it was sent
        out = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(shape), "data": to_json_data(value)}
        parameters = {key: getattr(p, p.WhichOneof("parameter_choice")) for key, p in tensor.parameters.items() if p.WhichOneof("parameter_choice")}
        if parameters:
            out["parameters"] = parameters
        outputs.append(out)
    return {"model_name": response.model_name, "model_version": response.model_version, "outputs": outputs}


def _error_text(content: bytes) -> str:
    try:
        error = orjson.loads(content)
        if isinstance(error, dict) and isinstance(error.get("error"), str):
            return error["error"][:300]
    except orjson.JSONDecodeError:
        pass
    return content[:300].decode("utf-8", "replace")


def predictor_outputs(predictor: Predictor, header: dict, binary: memoryview | None) -> tuple[list[tuple[dict, bytes | None]], np.ndarray]:
    """The predictor's outputs (each tensor's JSON, and its binary data if it came as such) and,
    as float64, the one named to be calibrated."""
    outputs = header.get("outputs")
    if not isinstance(outputs, list):
        raise failure(predictor, 502, "the predictor answered without outputs")
    kept: list[tuple[dict, bytes | None]] = []
    chosen = None
    offset = 0
    for tensor in outputs:
        if not isinstance(tensor, dict):
            raise failure(predictor, 502, "the predictor answered a malformed output", repr(tensor)[:300])
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        blob = None
        if size is not None:
            if binary is None or offset + size > len(binary):
                raise failure(predictor, 502, "the predictor answered with truncated binary data")
            blob = bytes(binary[offset : offset + size])
            offset += size
        if tensor.get("name") == predictor.output:
            chosen = _as_scores(predictor, tensor, blob)
        kept.append((tensor, blob))
    if chosen is None:
        names = [t.get("name") for t, _ in kept]
        raise failure(predictor, 502, f"the predictor answered without the output {predictor.output!r}", f"it gave {names}"[:300])
    return kept, chosen


def _as_scores(predictor: Predictor, tensor: dict, blob: bytes | None) -> np.ndarray:
    datatype = tensor.get("datatype")
    try:
        if datatype not in DTYPES or datatype == "BOOL":
            raise ValueError(f"datatype {datatype!r} is not numeric")
        shape = check_shape(tensor.get("shape"), "/shape")
        if blob is not None:
            return np.asarray(from_bytes(blob, datatype, shape, "/data"), dtype=np.float64)
        return np.asarray(tensor.get("data"), dtype=np.float64).reshape(shape)
    except (Problem, ValueError, TypeError) as error:
        detail = getattr(error, "detail", str(error))
        raise failure(predictor, 502, f"the predictor's output {predictor.output!r} is not a numeric tensor", detail) from None


def scores_for(calibrator_classes: int, binary_input: bool, values: np.ndarray) -> np.ndarray:
    """The predictor's output as the calibrator's scores: a binary calibrator takes the class-1
    column of a two-column output (sklearn's predict_proba), otherwise the output as it is."""
    if binary_input and values.ndim == 2 and values.shape[1] == 2 and calibrator_classes == 2:
        return np.ascontiguousarray(values[:, 1])
    return values
