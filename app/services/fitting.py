"""Fitting: fit a calibrator in a worker and store the version, at once or as an asynchronous job.

Shared by ``POST /calibrators`` (``?async=true`` answers 202 with a job, followed at
``GET /jobs/{id}``), imports and the recalibration loop. A job runs in the accepting
process's fit workers; while it waits, the worker's progress and a heartbeat are
copied into the job's row, so that any replica can answer for it. A job whose
process stops is marked failed by the sweep that every process runs
(``storage.jobs``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from ..storage import jobs as job_store
from ..storage import repository
from ..storage.jobs import JobInfo
from ..storage.models import utcnow
from ..storage.repository import VersionInfo
from ..workers.pool import PoolError
from ..workers.spool import FitJob
from .errors import FitFailed, InvalidRequest
from .metrics import FIT_DURATION
from .predictors import check_allowed

if TYPE_CHECKING:
    from .container import Services

logger = logging.getLogger("calibd")

#: What a fit's answer keeps of the summary by default (the rest: GET .../versions/{v}, or ?detail=full).
BRIEF_SUMMARY = ("before", "after", "fit", "timings")

#: How often a running job's progress and heartbeat are written.
TICK_SECONDS = 1.0


def version_out(info: VersionInfo, with_parameters: bool = False, brief: bool = False) -> dict[str, Any]:
    """A stored version as answers show it (and as a job keeps its result)."""
    summary = info.summary
    if brief:
        summary = {key: summary[key] for key in BRIEF_SUMMARY if key in summary}
    out = {
        "name": info.name,
        "version": info.version,
        "current": info.current,
        "method": info.method,
        "input": info.input_kind,
        "n_classes": info.n_classes,
        "classes": info.classes,
        "n_samples": info.n_samples,
        "holdout_sha256": info.holdout_sha256,
        "created_at": info.created_at,
        "fit_seconds": info.fit_seconds,
        "summary": summary,
    }
    if with_parameters:
        out["parameters"] = info.parameters
    return out


async def fit_and_store(services: Services, job: FitJob) -> VersionInfo:
    """Fit in a worker, store the version, and make it servable here at once. Raises FitFailed."""
    try:
        outcome, waited = await services.fit_pool.fit(job)
    except PoolError as error:
        raise FitFailed(503, error.detail, retry_after=error.retry_after) from None
    finally:
        job.discard_spool()
    if "problem" in outcome:
        problem = outcome["problem"]
        raise FitFailed(problem["status"], problem["detail"], problem["errors"])
    fitted = outcome["result"]
    try:  # a predictor the fit names must be allowed, as one set by PUT .../predictor
        check_allowed(services.settings, fitted["predictor"], "/predictor/url")
    except InvalidRequest as error:
        raise FitFailed(422, error.detail, [{"pointer": error.pointer, "detail": error.detail}]) from None
    # The wait for a worker is part of what the user waited for.
    fitted["fit_seconds"] += waited
    fitted["summary"].setdefault("timings", {})["wait"] = waited
    FIT_DURATION.labels(fitted["method"]).observe(fitted.pop("elapsed_seconds"))
    info = await run_in_threadpool(lambda: repository.create_version(services.sessions, **fitted))
    services.store.stored(info)
    if fitted["predictor"] is not None:
        services.store.set_predictor(info.name, fitted["predictor"])
    return info


# -- asynchronous fits ------------------------------------------------------------------------
async def submit(services: Services, job: FitJob, brief: bool = True) -> JobInfo:
    """Record a queued job and start running it in the background (``brief``: its result's summary)."""
    job_id = uuid.uuid4().hex
    name = (job.fields or {}).get("name")
    info = await run_in_threadpool(job_store.create_job, services.sessions, job_id, name, services.owner)
    job = FitJob(**{**job.__dict__, "job_id": job_id})
    services.running_jobs[job_id] = asyncio.create_task(_run(services, job, brief))
    return info


async def _run(services: Services, job: FitJob, brief: bool = True) -> None:
    job_id = job.job_id
    ticker = asyncio.create_task(_tick(services, job_id))
    try:
        info = await fit_and_store(services, job)
        values = {"state": "succeeded", "progress": 1.0, "stage": "stored", "calibrator": info.name,
                  "result": version_out(info, brief=brief)}
    except FitFailed as failed:
        values = {"state": "failed", "stage": "failed", "problem": _problem(failed.status, failed.detail, failed.errors)}
    except Exception:  # the job must end in a final state whatever happened
        logger.exception("fit job %s failed", job_id)
        values = {"state": "failed", "stage": "failed", "problem": _problem(500, "internal error; see the server log")}
    finally:
        ticker.cancel()
        services.fit_pool.progress.pop(job_id, None)
        services.running_jobs.pop(job_id, None)
    try:
        await run_in_threadpool(lambda: job_store.finish_job(services.sessions, job_id, **values))
    except Exception as error:  # the database is away: the sweep will mark it failed
        logger.warning("could not record the end of fit job %s: %s", job_id, error)


async def _tick(services: Services, job_id: str) -> None:
    """Copy the worker's progress into the job's row, and keep its heartbeat fresh."""
    started = False
    while True:
        await asyncio.sleep(TICK_SECONDS)
        fraction, stage = services.fit_pool.progress.get(job_id, (None, None))
        values: dict[str, Any] = {}
        if fraction is not None:
            values = {"progress": fraction, "stage": stage}
            if not started:
                values |= {"state": "running", "started_at": utcnow()}
                started = True
        try:
            await run_in_threadpool(lambda: job_store.update_job(services.sessions, job_id, **values))
        except Exception as error:
            logger.warning("could not update fit job %s: %s", job_id, error)


def _problem(status: int, detail: str, errors: list | None = None) -> dict[str, Any]:
    problem = {"status": status, "title": HTTPStatus(status).phrase, "detail": detail}
    if errors:
        problem["errors"] = errors
    return problem


async def interrupt_all(services: Services) -> None:
    """On shutdown: this process's jobs will not finish; say so now rather than after the sweep."""
    for job_id, task in list(services.running_jobs.items()):
        task.cancel()
        try:
            await run_in_threadpool(
                lambda: job_store.update_job(
                    services.sessions, job_id, state="failed", stage="interrupted", finished_at=utcnow(),
                    problem=_problem(503, "the fit was interrupted by a shutdown; submit it again"),
                )
            )
        except Exception as error:
            logger.warning("could not mark fit job %s interrupted: %s", job_id, error)
