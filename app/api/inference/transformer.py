"""Transformer mode: calibd in front of a model server that speaks the inference protocol over REST.

A calibrator with a predictor (CALIBD_PREDICTORS for that calibrator, else the CALIBD_PREDICTOR_URL
default of ``calibd serve --predictor``) takes ``/v2/models/{name}/infer`` requests without a
``scores`` input as the predictor's own requests: the body is forwarded as it came, the predictor's
named output (probabilities or logits) is calibrated by /calibrate's batch step, and the caller gets
the predictor's outputs with the calibrated ``probabilities`` added. ``parameters.ids`` log the
calibrated predictions for feedback, as on any /v2 request.

One pooled HTTP client keeps its connections to the predictors alive, bounded in number, each
request bounded in time. The predictor's failures are 502 (an error or no answer) or 504 (too slow)
problems naming it; calibd's own errors stay 4xx.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from ...config import Settings
from ..problems import Problem
from .tensors import DTYPES, check_shape, from_bytes

logger = logging.getLogger("calibd")

HEADER_LENGTH = "inference-header-content-length"
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Predictor:
    """Where a calibrator's model is served: the server's base URL, the model, and the output to calibrate."""

    url: str
    model: str
    output: str

    def infer_url(self) -> str:
        return f"{self.url.rstrip('/')}/v2/models/{self.model}/infer"


def predictor_for(settings: Settings, name: str) -> Predictor | None:
    """The calibrator's predictor: its own entry in CALIBD_PREDICTORS, else the server's default."""
    own = settings.predictors.get(name)
    if own is not None:
        return Predictor(own.url, own.model or name, own.output or settings.predictor_output)
    if settings.predictor_url:
        return Predictor(settings.predictor_url, name, settings.predictor_output)
    return None


def make_client(settings: Settings) -> aiohttp.ClientSession:
    """The pooled client for every predictor: keep-alive connections, bounded, each request within
    the timeout. aiohttp rather than httpx: its post took under half the CPU time of httpx's, measured here."""
    connector = aiohttp.TCPConnector(limit=settings.predictor_max_connections, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=settings.predictor_timeout_seconds)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def forward(client: aiohttp.ClientSession, predictor: Predictor, body: bytes) -> tuple[dict, memoryview | None]:
    """Send the caller's request (JSON) to the predictor; its response's JSON header and binary data."""
    url = predictor.infer_url()
    try:
        try:
            status, length, content = await _post(client, url, body)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
            if isinstance(error, aiohttp.ClientConnectorError):
                raise
            # A kept-alive connection the predictor had closed: inference changes nothing there, so send again.
            status, length, content = await _post(client, url, body)
    except asyncio.TimeoutError:
        raise Problem(504, f"the predictor {url} did not answer in time") from None
    except aiohttp.ClientError as error:
        raise Problem(502, f"the predictor {url} could not be reached: {type(error).__name__}") from None
    if status != 200:
        raise Problem(502, f"the predictor {url} answered {status}: {_error_text(content)}")
    try:
        if length is None:
            return orjson.loads(content), None
        return orjson.loads(content[: int(length)]), memoryview(content)[int(length) :]
    except (ValueError, orjson.JSONDecodeError):
        raise Problem(502, f"the predictor {url} answered with a body that is not an inference response") from None


async def _post(client: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str | None, bytes]:
    async with client.post(url, data=body, headers=JSON) as response:
        return response.status, response.headers.get(HEADER_LENGTH), await response.read()


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
        raise Problem(502, f"the predictor {predictor.infer_url()} answered without outputs")
    kept: list[tuple[dict, bytes | None]] = []
    chosen = None
    offset = 0
    for tensor in outputs:
        if not isinstance(tensor, dict):
            raise Problem(502, f"the predictor {predictor.infer_url()} answered with a malformed output")
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        blob = None
        if size is not None:
            if binary is None or offset + size > len(binary):
                raise Problem(502, f"the predictor {predictor.infer_url()} answered with truncated binary data")
            blob = bytes(binary[offset : offset + size])
            offset += size
        if tensor.get("name") == predictor.output:
            chosen = _as_scores(predictor, tensor, blob)
        kept.append((tensor, blob))
    if chosen is None:
        names = [t.get("name") for t, _ in kept]
        raise Problem(502, f"the predictor {predictor.infer_url()} answered without the output {predictor.output!r} (it gave {names})")
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
        raise Problem(502, f"the predictor {predictor.infer_url()}'s output {predictor.output!r} is not a numeric tensor: {detail}") from None


def scores_for(calibrator_classes: int, binary_input: bool, values: np.ndarray) -> np.ndarray:
    """The predictor's output as the calibrator's scores: a binary calibrator takes the class-1
    column of a two-column output (sklearn's predict_proba), otherwise the output as it is."""
    if binary_input and values.ndim == 2 and values.shape[1] == 2 and calibrator_classes == 2:
        return np.ascontiguousarray(values[:, 1])
    return values
