"""Asynchronous fits: POST /calibrators?async=true answers 202 with a job; GET /jobs/{id} follows it.

The accepting process runs the job in its fit workers, and while it waits it
copies the worker's progress reports and a heartbeat into the job's row, so
that any replica can answer GET /jobs/{id}. A job whose process stops is
marked failed by the sweep that every process runs (storage.jobs).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...storage import jobs as job_store
from ...storage.jobs import JobInfo, JobNotFound
from ...storage.models import utcnow
from ..auth import REQUIRE_READ
from ..problems import Problem
from ..state import Services, services
from ..validation import json_response
from ...workers.spool import FitJob
from .schemas import JobOut
from .versions import fit_and_store, version_out

logger = logging.getLogger("calibd")
router = APIRouter(tags=["calibrators"])

#: How often a running job's progress and heartbeat are written.
TICK_SECONDS = 1.0


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


async def submit(app: Services, job: FitJob, brief: bool = True) -> JobInfo:
    """Record a queued job and start running it in the background (``brief``: its result's summary)."""
    job_id = uuid.uuid4().hex
    name = (job.fields or {}).get("name")
    info = await run_in_threadpool(job_store.create_job, app.sessions, job_id, name, app.owner)
    app.running_jobs[job_id] = asyncio.create_task(_run(app, FitJob(**{**job.__dict__, "job_id": job_id}), brief))
    return info


async def _run(app: Services, job: FitJob, brief: bool = True) -> None:
    job_id = job.job_id
    ticker = asyncio.create_task(_tick(app, job_id))
    try:
        info = await fit_and_store(app, job)
        values = {"state": "succeeded", "progress": 1.0, "stage": "stored", "calibrator": info.name,
                  "result": version_out(info, brief=brief)}
    except Problem as problem:
        values = {"state": "failed", "stage": "failed", "problem": _problem(problem.status, problem.detail, problem.errors)}
    except Exception:  # the job must end in a final state whatever happened
        logger.exception("fit job %s failed", job_id)
        values = {"state": "failed", "stage": "failed", "problem": _problem(500, "internal error; see the server log")}
    finally:
        ticker.cancel()
        app.fit_pool.progress.pop(job_id, None)
        app.running_jobs.pop(job_id, None)
    try:
        await run_in_threadpool(lambda: job_store.finish_job(app.sessions, job_id, **values))
    except Exception as error:  # the database is away: the sweep will mark it failed
        logger.warning("could not record the end of fit job %s: %s", job_id, error)


async def _tick(app: Services, job_id: str) -> None:
    """Copy the worker's progress into the job's row, and keep its heartbeat fresh."""
    started = False
    while True:
        await asyncio.sleep(TICK_SECONDS)
        fraction, stage = app.fit_pool.progress.get(job_id, (None, None))
        values: dict[str, Any] = {}
        if fraction is not None:
            values = {"progress": fraction, "stage": stage}
            if not started:
                values |= {"state": "running", "started_at": utcnow()}
                started = True
        try:
            await run_in_threadpool(lambda: job_store.update_job(app.sessions, job_id, **values))
        except Exception as error:
            logger.warning("could not update fit job %s: %s", job_id, error)


def _problem(status: int, detail: str, errors: list | None = None) -> dict[str, Any]:
    problem = {"status": status, "title": HTTPStatus(status).phrase, "detail": detail}
    if errors:
        problem["errors"] = errors
    return problem


async def interrupt_all(app: Services) -> None:
    """On shutdown: this process's jobs will not finish; say so now rather than after the sweep."""
    for job_id, task in list(app.running_jobs.items()):
        task.cancel()
        try:
            await run_in_threadpool(
                lambda: job_store.update_job(
                    app.sessions, job_id, state="failed", stage="interrupted", finished_at=utcnow(),
                    problem=_problem(503, "the fit was interrupted by a shutdown; submit it again"),
                )
            )
        except Exception as error:
            logger.warning("could not mark fit job %s interrupted: %s", job_id, error)


@router.get("/jobs/{job_id}", summary="An asynchronous fit: state, progress, result or problem",
            dependencies=[REQUIRE_READ], response_model=JobOut, responses={404: {}})
async def get_job(request: Request, job_id: Annotated[str, Path(max_length=32)]) -> Response:
    try:
        info = await run_in_threadpool(job_store.get_job, services(request).sessions, job_id)
    except JobNotFound:
        raise Problem(404, f"no fit job {job_id!r}") from None
    return json_response(job_out(info))
