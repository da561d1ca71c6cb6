"""POST /cloudevents: KServe's payload logger as calibd's prediction log.

KServe's logger (kserve/kserve pkg/logger/worker.go, ``sendHttpCloudEvent``) posts each
inference request and its response as CloudEvents 1.0 in binary HTTP mode: the attributes are
headers (``ce-id``, shared by the two halves; ``ce-type`` ``org.kubeflow.serving.inference.request``
or ``.response``; ``ce-source``; ``ce-specversion``; the extensions ``ce-inferenceservicename``,
``ce-namespace``, ``ce-component``, ``ce-endpoint``), and the body is the request or response as
the model server took or gave it (the v1 or v2 protocol). This route reads the headers and, for
a response, the chosen output; services/cloudevents.py pairs the halves and logs the prediction.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter
from starlette.datastructures import QueryParams
from starlette.types import Receive, Scope, Send

from ..calibration import CalibrationInputError
from ..services import cloudevents as cloudevents_service
from ..services.errors import InvalidRequest
from .auth import REQUIRE_FEEDBACK, authorize, bearer_token
from .bodies import media_type, parse_json_object, require_json
from .edge import answer_error, asgi_route, read_body, send_json
from .problems import Problem
from .validation import MAX_ID_LENGTH

router = APIRouter(tags=["feedback"])

#: ce-type, as KServe's logger names the halves (pkg/logger/worker.go: CEInferenceRequest, CEInferenceResponse).
TYPES = {
    "org.kubeflow.serving.inference.request": cloudevents_service.REQUEST,
    "org.kubeflow.serving.inference.response": cloudevents_service.RESPONSE,
}


async def receive_cloudevent(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /cloudevents, a plain ASGI endpoint (``asgi_route``): the logger posts one per inference
    request and one per response, so the route spares itself FastAPI's request handling."""
    try:
        services = scope["app"].state.services
        headers = _headers(scope)
        authorize(services.keyring, bearer_token(headers.get("authorization")), ("feedback",))
        query = QueryParams(scope["query_string"]) if scope["query_string"] else {}
        kind, ce_id, name = _attributes(headers, query.get("calibrator"))
        body = await read_body(receive, services.settings.max_body_bytes)  # read whole, a request's too
        scores = None
        if kind == cloudevents_service.RESPONSE:
            require_json(headers)
            scores = _scores(parse_json_object(body), query.get("output") or services.settings.predictor_output)
            _check_row_ids(ce_id, scores)
        try:
            outcome = await cloudevents_service.receive_inference_event(services, kind, ce_id, name, scores)
        except InvalidRequest as error:
            raise Problem.invalid(error.pointer, error.detail) from None
        except CalibrationInputError as error:
            raise Problem.invalid("/outputs", str(error)) from None
        payload = orjson.dumps({"id": ce_id, "half": kind, "outcome": outcome})
    except Exception as error:
        await answer_error(scope, receive, send, error)
        return
    await send_json(send, payload, 202)


asgi_route(
    router, "/cloudevents", receive_cloudevent, ["POST"],
    dependencies=[REQUIRE_FEEDBACK],
    status_code=202,
    summary="Log a prediction from KServe's payload logger (CloudEvents, binary mode)",
    description=(
        "Takes the inference request and response CloudEvents of KServe's logger (headers ce-id, ce-type "
        "org.kubeflow.serving.inference.request or .response, ce-source, ce-specversion 1.0; the body the v1 or v2 "
        "payload). Once both halves of a ce-id are here, the response's output is calibrated with the calibrator "
        "and logged under the ce-id (ce-id/0, ce-id/1, ... for a batch of rows): labels then come by that id "
        "through /feedback. Sent again, either half is a duplicate and changes nothing."
    ),
    openapi_extra={"parameters": [
        {"name": "calibrator", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "the calibrator; default: the ce-inferenceservicename header"},
        {"name": "output", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "the v2 response's output to calibrate; default: CALIBD_PREDICTOR_OUTPUT"},
    ]},
    responses={202: {"description": "outcome: waiting (for the other half), paired (logged) or duplicate"},
               404: {}, 413: {}, 415: {}, 422: {}},
)


#: The headers the route reads; the logger sends a dozen more (ce-time, ce-metadata, ...).
_READ = frozenset({b"authorization", b"content-type", b"ce-id", b"ce-type", b"ce-source", b"ce-specversion",
                   b"ce-inferenceservicename"})


def _headers(scope: Scope) -> dict[str, str]:
    """The headers the route reads, by lower-case name (the first of a repeated one, as Starlette's
    ``Headers.get``), in one pass over the request's headers rather than one pass a header."""
    found: dict[str, str] = {}
    for key, value in scope["headers"]:
        if key in _READ:
            found.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return found


if os.environ.get("CALIBD_BENCHMARK_ROUTES") == "1":
    # The benchmarks' floor (benchmarks/streams_ingest.py --floor), never served in production:
    # an event taken as POST /cloudevents takes it (the edge, the key, the headers checked, the
    # body read within the limit) and answered 202 without reading the body or pairing. What
    # /calibrate's p99 loses to a logger posting here is what any route answering each event over
    # HTTP in this process costs it.
    async def cloudevent_floor(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            services = scope["app"].state.services
            headers = _headers(scope)
            authorize(services.keyring, bearer_token(headers.get("authorization")), ("feedback",))
            kind, ce_id, _ = _attributes(headers, None)
            await read_body(receive, services.settings.max_body_bytes)
            payload = orjson.dumps({"id": ce_id, "half": kind, "outcome": "waiting"})
        except Exception as error:
            await answer_error(scope, receive, send, error)
            return
        await send_json(send, payload, 202)

    asgi_route(router, "/benchmark/cloudevents-floor", cloudevent_floor, ["POST"], include_in_schema=False)


def _attributes(headers: dict[str, str], calibrator: str | None) -> tuple[str, str, str]:
    """The event's half, id and calibrator, from its ce-* headers (and the query's calibrator)."""
    if media_type(headers) == "application/cloudevents+json":
        raise Problem(415, "structured CloudEvents are not taken: send them in binary mode (ce-* headers), as KServe's logger does")
    ce_id = _header(headers, "ce-id")
    if len(ce_id) > MAX_ID_LENGTH:
        raise Problem.invalid("/headers/ce-id", f"longer than {MAX_ID_LENGTH} characters")
    if _header(headers, "ce-specversion") != "1.0":
        raise Problem.invalid("/headers/ce-specversion", "must be 1.0")
    _header(headers, "ce-source")
    kind = TYPES.get(_header(headers, "ce-type"))
    if kind is None:
        raise Problem.invalid("/headers/ce-type", f"must be one of {sorted(TYPES)}")
    name = calibrator or headers.get("ce-inferenceservicename")
    if not name:
        raise Problem.invalid("/headers/ce-inferenceservicename", "required when the query names no calibrator")
    return kind, ce_id, name


def _check_row_ids(ce_id: str, scores: np.ndarray) -> None:
    """A response of several rows is logged as ce-id/0, ce-id/1, ...: each must fit a prediction id."""
    rows = scores.shape[0] if scores.ndim else 1
    if rows > 1 and len(f"{ce_id}/{rows - 1}") > MAX_ID_LENGTH:
        raise Problem.invalid(
            "/headers/ce-id", f"its {rows} rows are logged as ce-id/0 to ce-id/{rows - 1}: "
            f"at most {MAX_ID_LENGTH - len(f'/{rows - 1}')} characters with this many rows",
        )


def _header(headers: Any, key: str) -> str:
    value = headers.get(key)
    if not value:
        raise Problem.invalid(f"/headers/{key}", "required (a CloudEvent in binary mode)")
    return value


def _scores(body: dict[str, Any], output: str) -> np.ndarray:
    """The response's scores: a v2 response's output named ``output``, or a v1 response's ``predictions``."""
    if "outputs" in body:
        outputs = body["outputs"]
        if not isinstance(outputs, list):
            raise Problem.invalid("/outputs", "must be a list of tensors")
        for index, tensor in enumerate(outputs):
            if isinstance(tensor, dict) and tensor.get("name") == output:
                return _tensor(tensor, f"/outputs/{index}")
        names = [t.get("name") for t in outputs if isinstance(t, dict)]
        raise Problem.invalid("/outputs", f"no output named {output!r} (the response has {names}); choose one with ?output=")
    if "predictions" in body:
        return _numbers(body["predictions"], "/predictions")
    raise Problem.invalid("/outputs", "a response of the v2 protocol (outputs) or v1 (predictions) is required")


def _tensor(tensor: dict[str, Any], where: str) -> np.ndarray:
    parameters = tensor.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise Problem.invalid(f"{where}/parameters", "must be an object")
    if (parameters or {}).get("binary_data_size") is not None:
        raise Problem.invalid(f"{where}/parameters/binary_data_size", "binary tensor data is not taken: log JSON outputs")
    values = _numbers(tensor.get("data"), f"{where}/data")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise Problem.invalid(f"{where}/shape", "must be a list of non-negative integers")
    if math.prod(shape) != values.size:
        raise Problem.invalid(f"{where}/shape", f"{shape} does not hold the {values.size} values of data")
    return values.reshape(shape)


def _numbers(data: Any, where: str) -> np.ndarray:
    try:
        values = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise Problem.invalid(where, "must be numbers, or equal-length rows of numbers") from None
    if values.ndim == 0 or not np.all(np.isfinite(values)):
        raise Problem.invalid(where, "must be a list of finite numbers")
    return values
