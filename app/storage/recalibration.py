"""Closed-loop recalibration: policies, the loop's state, its events, and the feedback it learns from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, null, select, update

from .db import transaction
from .sql import insert_for
from .models import CalibratorRow, FeedbackRow, RecalibrationEventRow, RecalibrationPolicyRow, utcnow
from .repository import NotFound, Sessions

LEASE = timedelta(seconds=120)


def _calibrator_id(session, name: str) -> int:
    calibrator_id = session.scalar(select(CalibratorRow.id).where(CalibratorRow.name == name))
    if calibrator_id is None:
        raise NotFound(name)
    return calibrator_id


def set_policy(sessions: Sessions, name: str, policy: dict[str, Any]) -> dict[str, Any]:
    with transaction(sessions) as session:
        calibrator_id = _calibrator_id(session, name)
        now = utcnow()
        statement = insert_for(session)(RecalibrationPolicyRow).values(calibrator_id=calibrator_id, policy=policy, updated_at=now)
        session.execute(
            statement.on_conflict_do_update(index_elements=["calibrator_id"], set_={"policy": policy, "updated_at": now})
        )
    return policy


def get_state(sessions: Sessions, name: str, events: int = 50) -> dict[str, Any]:
    """The policy (null when none), the pending candidate and the latest events, newest first."""
    with transaction(sessions) as session:
        calibrator_id = _calibrator_id(session, name)
        row = session.get(RecalibrationPolicyRow, calibrator_id)
        recent = session.scalars(
            select(RecalibrationEventRow)
            .where(RecalibrationEventRow.calibrator_id == calibrator_id)
            .order_by(RecalibrationEventRow.id.desc())
            .limit(events)
        ).all()
        return {
            "policy": row.policy if row else None,
            "candidate_version": row.candidate_version if row else None,
            "last_refit_at": row.last_refit_at if row else None,
            "events": [
                {
                    "created_at": e.created_at,
                    "outcome": e.outcome,
                    "candidate_version": e.candidate_version,
                    "reason": e.reason,
                    "details": e.details,
                }
                for e in recent
            ],
        }


def enabled_calibrators(sessions: Sessions) -> list[tuple[int, str]]:
    with transaction(sessions) as session:
        rows = session.execute(
            select(RecalibrationPolicyRow.calibrator_id, CalibratorRow.name, RecalibrationPolicyRow.policy).join(
                CalibratorRow, CalibratorRow.id == RecalibrationPolicyRow.calibrator_id
            )
        ).all()
    return [(calibrator_id, name) for calibrator_id, name, policy in rows if policy.get("enabled", True)]


def claim(sessions: Sessions, calibrator_id: int, owner: str) -> dict[str, Any] | None:
    """Take the calibrator's lease (one process works on its loop at a time); its row, or None."""
    now = utcnow()
    with transaction(sessions) as session:
        taken = session.execute(
            update(RecalibrationPolicyRow)
            .where(
                RecalibrationPolicyRow.calibrator_id == calibrator_id,
                (RecalibrationPolicyRow.lease_owner.is_(None))
                | (RecalibrationPolicyRow.lease_until < now)
                | (RecalibrationPolicyRow.lease_owner == owner),
            )
            .values(lease_owner=owner, lease_until=now + LEASE)
        ).rowcount
        if not taken:
            return None
        row = session.get(RecalibrationPolicyRow, calibrator_id)
        return {
            "policy": row.policy,
            "candidate_version": row.candidate_version,
            "candidate_after_feedback_id": row.candidate_after_feedback_id,
            "last_refit_at": row.last_refit_at,
        }


def release(sessions: Sessions, calibrator_id: int, owner: str, **values: Any) -> None:
    """Record the loop's new state and give the lease back."""
    with transaction(sessions) as session:
        session.execute(
            update(RecalibrationPolicyRow)
            .where(RecalibrationPolicyRow.calibrator_id == calibrator_id, RecalibrationPolicyRow.lease_owner == owner)
            .values(lease_owner=None, lease_until=None, **values)
        )


def record_event(
    sessions: Sessions, calibrator_id: int, outcome: str, reason: str, candidate_version: int | None, details: dict
) -> None:
    with transaction(sessions) as session:
        session.add(
            RecalibrationEventRow(
                calibrator_id=calibrator_id, outcome=outcome, candidate_version=candidate_version,
                reason=reason[:500], details=details, created_at=utcnow(),
            )
        )


@dataclass
class LabelledRows:
    """Labelled feedback rows with raw scores, oldest first."""

    scores: list
    labels: list[int]
    #: Each row's features ({column: value}, or None), when asked for.
    features: list[dict[str, Any] | None] | None = None
    #: Feedback ids of the first and last row.
    ids: tuple[int, int] | None = None


def recent_labelled(sessions: Sessions, calibrator_id: int, limit: int, features: bool = False) -> tuple[LabelledRows, int | None]:
    """The ``limit`` mature labelled rows with the newest predictions that carry raw scores (with their
    features, if asked), oldest first, and the newest feedback id of the calibrator."""
    columns = [FeedbackRow.id, FeedbackRow.scores, FeedbackRow.label, *([FeedbackRow.features] if features else [])]
    with transaction(sessions) as session:
        rows = session.execute(
            select(*columns)
            .where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.scores.is_not(None), ~FeedbackRow.waiting)
            .order_by(FeedbackRow.predicted_at.desc(), FeedbackRow.id.desc())
            .limit(limit)
        ).all()
        newest = session.scalar(select(func.max(FeedbackRow.id)).where(FeedbackRow.calibrator_id == calibrator_id))
    # Rows stored before scores were written as SQL NULL hold a JSON null on SQLite.
    rows = [r for r in reversed(rows) if r[1] is not None]
    return LabelledRows(
        [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows] if features else None,
        (rows[0][0], rows[-1][0]) if rows else None,
    ), newest


def shadow_rows(
    sessions: Sessions, calibrator_id: int, version: int, after_id: int, limit: int, features: bool = False
) -> list[tuple]:
    """Mature labelled rows served by ``version`` after the refit that ended at feedback id ``after_id``,
    with raw scores (and, with ``features``, only those with features): (scores, label, served probability,
    served rows, features).

    "After" is by prediction time: rows predicted after the newest prediction the refit could see. By id,
    it would take the labels that arrive late in a row's window (the implied negatives, stored at
    maturity) and leave out the early ones of the same predictions (positives, stored on arrival).
    """
    with transaction(sessions) as session:
        after_time = session.scalar(
            select(func.max(FeedbackRow.predicted_at)).where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.id <= after_id)
        )
        later = FeedbackRow.id > after_id if after_time is None else FeedbackRow.predicted_at > after_time
        rows = (
            session.execute(
                select(FeedbackRow.scores, FeedbackRow.label, FeedbackRow.probability, FeedbackRow.probabilities,
                       FeedbackRow.features if features else null())
                .where(
                    FeedbackRow.calibrator_id == calibrator_id,
                    FeedbackRow.version == version,
                    later,
                    FeedbackRow.scores.is_not(None),
                    ~FeedbackRow.waiting,
                    *([FeedbackRow.features.is_not(None)] if features else []),
                )
                .order_by(FeedbackRow.predicted_at, FeedbackRow.id)
                .limit(limit)
            ).all()
        )
    return [r for r in rows if r[0] is not None]  # JSON nulls of rows stored before scores were SQL NULL


def due(last_refit_at: datetime | None, hours: float | None, now: datetime) -> bool:
    return hours is not None and (last_refit_at is None or now - last_refit_at >= timedelta(hours=hours))
