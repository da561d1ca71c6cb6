"""Asynchronous fit jobs: their rows, progress and fate.

The process that accepted a job runs it and refreshes its heartbeat. A job
whose heartbeat stops (its process was restarted or killed) is marked failed
by whichever process sweeps next, so no job stays "running" forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update

from .db import transaction
from .models import FitJobRow, utcnow
from .repository import Sessions

#: A job not heard of for this long is considered interrupted.
HEARTBEAT_TIMEOUT = timedelta(seconds=30)
ACTIVE = ("queued", "running")


class JobNotFound(LookupError):
    pass


@dataclass(frozen=True)
class JobInfo:
    id: str
    state: str
    calibrator: str | None
    progress: float
    stage: str
    result: dict[str, Any] | None
    problem: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    def eta_seconds(self, now: datetime) -> float | None:
        """Time left, extrapolated from the progress so far."""
        if self.state != "running" or self.started_at is None or self.progress <= 0:
            return None
        elapsed = (now - self.started_at).total_seconds()
        return max(elapsed * (1.0 - self.progress) / self.progress, 0.0)


def _info(row: FitJobRow) -> JobInfo:
    return JobInfo(
        row.id, row.state, row.calibrator, row.progress, row.stage, row.result, row.problem,
        row.created_at, row.started_at, row.finished_at,
    )


def create_job(sessions: Sessions, job_id: str, calibrator: str | None, owner: str) -> JobInfo:
    now = utcnow()
    row = FitJobRow(
        id=job_id, state="queued", calibrator=calibrator, owner=owner, progress=0.0, stage="queued",
        created_at=now, heartbeat_at=now,
    )
    with transaction(sessions) as session:
        session.add(row)
        session.flush()
        return _info(row)


def get_job(sessions: Sessions, job_id: str) -> JobInfo:
    with transaction(sessions) as session:
        row = session.get(FitJobRow, job_id)
        if row is None:
            raise JobNotFound(job_id)
        return _info(row)


def update_job(sessions: Sessions, job_id: str, **values: Any) -> None:
    """Set fields of an active job (progress, stage, state...) and refresh its heartbeat."""
    values["heartbeat_at"] = utcnow()
    with transaction(sessions) as session:
        session.execute(update(FitJobRow).where(FitJobRow.id == job_id, FitJobRow.state.in_(ACTIVE)).values(**values))


def finish_job(sessions: Sessions, job_id: str, **values: Any) -> None:
    """Record a job's end; one too quick to be seen running started when it finished."""
    now = utcnow()
    values |= {"finished_at": now, "heartbeat_at": now, "started_at": func.coalesce(FitJobRow.started_at, now)}
    with transaction(sessions) as session:
        session.execute(update(FitJobRow).where(FitJobRow.id == job_id, FitJobRow.state.in_(ACTIVE)).values(**values))


def heartbeat(sessions: Sessions, job_ids: list[str]) -> None:
    if not job_ids:
        return
    with transaction(sessions) as session:
        session.execute(
            update(FitJobRow).where(FitJobRow.id.in_(job_ids), FitJobRow.state.in_(ACTIVE)).values(heartbeat_at=utcnow())
        )


def sweep_interrupted(sessions: Sessions, now: datetime | None = None) -> int:
    """Mark failed every active job whose process stopped answering. Returns how many."""
    now = now or utcnow()
    problem = {
        "status": 503,
        "title": "Service Unavailable",
        "detail": "the fit was interrupted (the process running it stopped); submit it again",
    }
    with transaction(sessions) as session:
        stale = session.scalars(
            select(FitJobRow.id).where(FitJobRow.state.in_(ACTIVE), FitJobRow.heartbeat_at < now - HEARTBEAT_TIMEOUT)
        ).all()
        if stale:
            session.execute(
                update(FitJobRow)
                .where(FitJobRow.id.in_(stale), FitJobRow.state.in_(ACTIVE))
                .values(state="failed", problem=problem, finished_at=now, stage="interrupted")
            )
        return len(stale)
