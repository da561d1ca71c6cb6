"""Labels that arrived before their prediction was logged: stored, claimed when it is, or marked unmatched.

A label waits (unique per calibrator and id) until the prediction log writer
or a periodic sweep of any process joins it. Claims delete the rows with
RETURNING: of two processes claiming at once, the second waits for the
first's row locks (PostgreSQL) or its write lock (SQLite), then finds the
rows gone, so no label is joined twice.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from .db import transaction
from .models import CalibratorRow, PendingLabelRow, PredictionRow
from .sql import ID_CHUNK, NotFound, Sessions, insert_for


def add(session: Session, calibrator_id: int, ids: list[str], label_of: dict[str, int], now: datetime) -> list[str]:
    """Store labels waiting for their prediction; returns the ids stored (the others already had one)."""
    statement = (
        insert_for(session)(PendingLabelRow)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "prediction_id"])
        .returning(PendingLabelRow.prediction_id)
    )
    rows = [  # sorted by id, as feedback rows are: no deadlock between two requests
        {"calibrator_id": calibrator_id, "prediction_id": i, "label": label_of[i], "received_at": now} for i in sorted(ids)
    ]
    return list(session.scalars(statement, rows))


def claim(session: Session, calibrator_id: int, ids: list[str]) -> list[tuple[str, int]]:
    """Take (delete and return) the pending labels of these ids: (id, label)."""
    claimed: list[tuple[str, int]] = []
    for start in range(0, len(ids), ID_CHUNK):
        claimed += session.execute(
            delete(PendingLabelRow)
            .where(
                PendingLabelRow.calibrator_id == calibrator_id,
                PendingLabelRow.prediction_id.in_(ids[start : start + ID_CHUNK]),
                PendingLabelRow.unmatched_at.is_(None),
            )
            .returning(PendingLabelRow.prediction_id, PendingLabelRow.label)
        ).all()
    return claimed


def any_waiting(session: Session) -> bool:
    return session.scalar(select(PendingLabelRow.id).where(PendingLabelRow.unmatched_at.is_(None)).limit(1)) is not None


def claim_joinable(session: Session) -> list[tuple[int, str, int]]:
    """Take every pending label whose prediction is now logged: (calibrator id, id, label)."""
    logged = select(PredictionRow.id).where(
        PredictionRow.calibrator_id == PendingLabelRow.calibrator_id,
        PredictionRow.prediction_id == PendingLabelRow.prediction_id,
    )
    return list(
        session.execute(
            delete(PendingLabelRow)
            .where(PendingLabelRow.unmatched_at.is_(None), logged.exists())
            .returning(PendingLabelRow.calibrator_id, PendingLabelRow.prediction_id, PendingLabelRow.label)
        ).all()
    )


def mark_unmatched(session: Session, received_before: datetime, now: datetime) -> Counter[int]:
    """Mark labels waiting since before ``received_before`` unmatched; how many, by calibrator id."""
    late = session.execute(
        update(PendingLabelRow)
        .where(PendingLabelRow.unmatched_at.is_(None), PendingLabelRow.received_at < received_before)
        .values(unmatched_at=now)
        .returning(PendingLabelRow.calibrator_id)
    ).scalars().all()
    return Counter(late)


def names(session: Session, calibrator_ids: list[int]) -> dict[int, str]:
    return dict(session.execute(select(CalibratorRow.id, CalibratorRow.name).where(CalibratorRow.id.in_(calibrator_ids))).all())


def listing(sessions: Sessions, name: str, limit: int) -> dict[str, Any]:
    """How many of a calibrator's labels wait for their prediction, and those past the grace period (newest first)."""
    with transaction(sessions) as session:
        calibrator_id = session.scalar(select(CalibratorRow.id).where(CalibratorRow.name == name))
        if calibrator_id is None:
            raise NotFound(name)
        counts = dict(
            session.execute(
                select(PendingLabelRow.unmatched_at.is_(None), func.count())
                .where(PendingLabelRow.calibrator_id == calibrator_id)
                .group_by(PendingLabelRow.unmatched_at.is_(None))
            ).all()
        )
        rows = session.execute(
            select(PendingLabelRow.prediction_id, PendingLabelRow.label, PendingLabelRow.received_at, PendingLabelRow.unmatched_at)
            .where(PendingLabelRow.calibrator_id == calibrator_id, PendingLabelRow.unmatched_at.is_not(None))
            .order_by(PendingLabelRow.id.desc())
            .limit(limit)
        ).all()
    return {
        "pending": int(counts.get(True, 0)),
        "unmatched": int(counts.get(False, 0)),
        "labels": [
            {"id": prediction_id, "label": label, "received_at": received_at, "unmatched_at": unmatched_at}
            for prediction_id, label, received_at, unmatched_at in rows
        ],
    }
