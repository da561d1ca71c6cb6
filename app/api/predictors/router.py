"""/calibrators/{name}/predictor: the model server a calibrator forwards to in transformer mode.

Stored with the calibrator, it takes precedence over CALIBD_PREDICTORS and the default of
``calibd serve --predictor``; every process serves a change within CALIBD_VERSION_POLL_SECONDS
(the one that made it, at once).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...config import Settings
from ...services import predictors as predictor_service
from ...services.errors import InvalidRequest
from ..auth import REQUIRE_ADMIN, REQUIRE_READ
from ..inference.transformer import choose
from ..problems import Problem
from ..state import services_of
from ..validation import NamePath, json_response, read_json, request_body
from .schemas import PredictorIn, PredictorOut

router = APIRouter(tags=["transformer mode"])

PATH = "/calibrators/{name}/predictor"


def _out(settings: Settings, name: str, stored: dict[str, Any] | None) -> dict[str, Any]:
    effective = choose(settings, name, stored)
    return {"calibrator": name, "stored": stored, "effective": None if effective is None else effective.as_json()}


@router.get(
    PATH,
    dependencies=[REQUIRE_READ],
    summary="The predictor a calibrator forwards /v2 infer requests without scores to",
    response_model=PredictorOut,
    responses={404: {}},
)
async def get_predictor(request: Request, name: NamePath) -> Response:
    services = services_of(request)
    stored = await run_in_threadpool(predictor_service.get_predictor, services, name)
    return json_response(_out(services.settings, name, stored))


@router.put(
    PATH,
    dependencies=[REQUIRE_ADMIN],
    summary="Store the predictor a calibrator forwards /v2 infer requests without scores to",
    description=(
        'url: http(s)://host[:port][/prefix] (REST) or grpc://host:port (gRPC); model: its name on the '
        "predictor (default: the calibrator's); output: the output to calibrate (default: CALIBD_PREDICTOR_OUTPUT). "
        "Takes precedence over CALIBD_PREDICTORS and CALIBD_PREDICTOR_URL. The URL's host must be allowed by "
        "CALIBD_PREDICTOR_ALLOW (else 422 at /url)."
    ),
    openapi_extra=request_body(("application/json", PredictorIn)),
    response_model=PredictorOut,
    responses={404: {}, 415: {}, 422: {}},
)
async def put_predictor(request: Request, name: NamePath) -> Response:
    value = (await read_json(request, PredictorIn)).model_dump()
    return await _store(request, name, value)


@router.delete(
    PATH,
    dependencies=[REQUIRE_ADMIN],
    summary="Remove a calibrator's stored predictor (CALIBD_PREDICTORS and the default apply again)",
    response_model=PredictorOut,
    responses={404: {}},
)
async def delete_predictor(request: Request, name: NamePath) -> Response:
    return await _store(request, name, None)


async def _store(request: Request, name: str, value: dict[str, Any] | None) -> Response:
    services = services_of(request)
    try:
        await run_in_threadpool(predictor_service.set_predictor, services, name, value)
    except InvalidRequest as error:
        raise Problem.invalid(error.pointer, error.detail) from None
    return json_response(_out(services.settings, name, value))
