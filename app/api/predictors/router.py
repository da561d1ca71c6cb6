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
from ...storage import predictors as predictor_store
from ..auth import REQUIRE_ADMIN, REQUIRE_READ
from ..inference.transformer import choose
from ..state import services
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
    app = services(request)
    stored = await run_in_threadpool(predictor_store.get_predictor, app.sessions, name)
    return json_response(_out(app.settings, name, stored))


@router.put(
    PATH,
    dependencies=[REQUIRE_ADMIN],
    summary="Store the predictor a calibrator forwards /v2 infer requests without scores to",
    description=(
        'url: http(s)://host[:port][/prefix] (REST) or grpc://host:port (gRPC); model: its name on the '
        "predictor (default: the calibrator's); output: the output to calibrate (default: CALIBD_PREDICTOR_OUTPUT). "
        "Takes precedence over CALIBD_PREDICTORS and CALIBD_PREDICTOR_URL."
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
    app = services(request)
    await run_in_threadpool(predictor_store.set_predictor, app.sessions, name, value)
    app.store.set_predictor(name, value)
    return json_response(_out(app.settings, name, value))
