"""/healthz (the process is up) and /readyz (the database is reachable and migrated, the fit workers started)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .. import __version__
from ..storage import migrate
from .problems import STORAGE_FAULTS, Problem
from .state import Services, services_of
from .validation import json_response

router = APIRouter(tags=["health"])

#: How long /readyz answers "not ready" after the database refused a write as full or read-only.
STORAGE_FAULT_MEMORY_SECONDS = 30


@router.get("/healthz", summary="Liveness, with calibd's version")
async def healthz() -> Response:
    return json_response({"status": "ok", "version": __version__})


@router.get("/readyz", summary="Readiness: database reachable, migrations at head", responses={503: {}})
async def readyz(request: Request) -> Response:
    problem = await readiness_problem(services_of(request))
    if problem is not None:
        raise problem
    return json_response({"status": "ready"})


async def readiness_problem(services: Services) -> Problem | None:
    """Why this process cannot serve (a 503 problem), or None when it can."""
    engine = services.probe_engine or services.engine  # its own connection and short timeouts

    def check() -> str | None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            if connection.dialect.name == "postgresql" and connection.execute(text("SHOW transaction_read_only")).scalar() == "on":
                return STORAGE_FAULTS["read-only"][1]
        if not migrate.is_at_head(engine):
            return "the database schema is behind; run `calibd migrate`"
        return None

    try:
        problem = await run_in_threadpool(check)
    except Exception as error:  # any driver error means: not ready
        return Problem(503, f"database unreachable: {type(error).__name__}", headers={"Retry-After": "5"})
    if problem:
        return Problem(503, problem)
    fault = services.storage_fault
    if fault is not None and time.monotonic() - fault[1] < STORAGE_FAULT_MEMORY_SECONDS:
        return Problem(503, STORAGE_FAULTS[fault[0]][1])
    if not services.fit_pool.warm():  # seconds after a start: a fit now would wait for them
        return Problem(503, "the fit workers are starting", headers={"Retry-After": "1"})
    return None
