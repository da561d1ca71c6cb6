"""The closed-loop recalibration policy of a calibrator, and the loop's events (services/recalibration.py
carries the loop out)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..services.recalibration import RecalibrationPolicy
from ..storage import recalibration as loop_store
from .auth import REQUIRE_ADMIN, REQUIRE_READ
from .problems import Problem
from .state import services_of
from .validation import NamePath, json_response, read_json, request_body

router = APIRouter(tags=["recalibration"])


class RecalibrationOut(BaseModel):
    policy: RecalibrationPolicy | None
    candidate_version: int | None
    last_refit_at: str | None
    events: list[dict[str, Any]]


@router.put(
    "/calibrators/{name}/recalibration",
    summary="Set the closed-loop recalibration policy",
    dependencies=[REQUIRE_ADMIN],
    openapi_extra=request_body(("application/json", RecalibrationPolicy)),
    response_model=RecalibrationPolicy,
    responses={404: {}},
)
async def set_policy(request: Request, name: NamePath) -> Response:
    policy = await read_json(request, RecalibrationPolicy)
    if policy.trigger != "alarm" and policy.schedule_hours is None:
        raise Problem.invalid("/schedule_hours", "required with a schedule trigger")
    stored = await run_in_threadpool(loop_store.set_policy, services_of(request).sessions, name, policy.model_dump())
    return json_response(stored)


@router.get(
    "/calibrators/{name}/recalibration",
    summary="The policy, the pending candidate and the loop's events",
    dependencies=[REQUIRE_READ],
    response_model=RecalibrationOut,
    responses={404: {}},
)
async def get_state(request: Request, name: NamePath, events: Annotated[int, Query(ge=1, le=1000)] = 50) -> Response:
    return json_response(await run_in_threadpool(loop_store.get_state, services_of(request).sessions, name, events))
