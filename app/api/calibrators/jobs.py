"""GET /jobs/{id}: an asynchronous fit (POST /calibrators?async=true) followed by any replica."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...storage import jobs as job_store
from ...storage.jobs import JobInfo, JobNotFound
from ...storage.models import utcnow
from ..auth import REQUIRE_READ
from ..problems import Problem
from ..state import services_of
from ..validation import json_response
from .schemas import JobOut

router = APIRouter(tags=["calibrators"])


def job_out(info: JobInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "state": info.state,
        "calibrator": info.calibrator,
        "progress": info.progress,
        "stage": info.stage,
        "eta_seconds": info.eta_seconds(utcnow()),
        "created_at": info.created_at,
        "started_at": info.started_at,
        "finished_at": info.finished_at,
        "result": info.result,
        "problem": info.problem,
    }


@router.get("/jobs/{job_id}", summary="An asynchronous fit: state, progress, result or problem",
            dependencies=[REQUIRE_READ], response_model=JobOut, responses={404: {}})
async def get_job(request: Request, job_id: Annotated[str, Path(max_length=32)]) -> Response:
    try:
        info = await run_in_threadpool(job_store.get_job, services_of(request).sessions, job_id)
    except JobNotFound:
        raise Problem(404, f"no fit job {job_id!r}") from None
    return json_response(job_out(info))
