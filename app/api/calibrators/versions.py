"""Stored versions: fitting and storing one, and its JSON shape in answers.

Shared by the /calibrators routes, asynchronous fit jobs, imports and the
recalibration loop.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool

from ...storage import repository
from ...storage.repository import VersionInfo
from ...workers.pool import PoolError
from ...workers.spool import FitJob
from ..observability import FIT_DURATION
from ..problems import Problem
from ..state import Services

#: What a fit's answer keeps of the summary by default (the rest: GET .../versions/{v}, or ?detail=full).
BRIEF_SUMMARY = ("before", "after", "fit", "timings")


def version_out(info: VersionInfo, with_parameters: bool = False, brief: bool = False) -> dict[str, Any]:
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


async def fit_and_store(app: Services, job: FitJob) -> VersionInfo:
    """Fit in a worker, store the version, and make it servable here at once."""
    try:
        outcome, waited = await app.fit_pool.fit(job)
    except PoolError as error:
        headers = None if error.retry_after is None else {"Retry-After": str(error.retry_after)}
        raise Problem(503, error.detail, headers=headers) from None
    finally:
        job.discard_spool()
    if "problem" in outcome:
        problem = outcome["problem"]
        raise Problem(problem["status"], problem["detail"], problem["errors"])
    fitted = outcome["result"]
    # The wait for a worker is part of what the user waited for.
    fitted["fit_seconds"] += waited
    fitted["summary"].setdefault("timings", {})["wait"] = waited
    FIT_DURATION.labels(fitted["method"]).observe(fitted.pop("elapsed_seconds"))
    info = await run_in_threadpool(lambda: repository.create_version(app.sessions, **fitted))
    app.store.stored(info)
    if fitted["predictor"] is not None:
        app.store.set_predictor(info.name, fitted["predictor"])
    return info
