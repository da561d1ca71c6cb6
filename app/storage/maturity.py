"""Label timing rows: each calibrator's label window, its maturity cursor and counters, the rows that
wait for maturity, and the histogram of label delays.

A calibrator with a label window keeps a cursor, ``matured_through``: every
prediction served up to it is mature. Writers of its feedback hold its
maturity row (FOR UPDATE) while they decide which labels are late, and the
maturity step holds it while it advances the cursor: so a label is either
stored as waiting before the step reads it, or seen as late after, never both
or neither, across processes and replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from .db import transaction
from .models import CalibratorRow, FeedbackRow, LabelDelayRow, LabelMaturityRow, PredictionRow
from .sql import NotFound, Sessions, insert_for, is_postgresql


@dataclass(frozen=True)
class LabelSettings:
    """How a calibrator's labels arrive: its window in seconds (None: final on arrival), what a missing
    label is, and (with a window) the time up to which its predictions are mature."""

    window_seconds: float | None = None
    missing: str = "negative"
    matured_through: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"window_seconds": self.window_seconds, "missing": self.missing}


def settings_of(session: Session, calibrator_id: int, lock: bool = False) -> LabelSettings | None:
    """A calibrator's label settings (None: no such calibrator). With ``lock`` and a window, its maturity
    row is held until the transaction ends."""
    row = session.execute(
        select(CalibratorRow.label_window_seconds, CalibratorRow.label_missing).where(CalibratorRow.id == calibrator_id)
    ).first()
    if row is None:
        return None
    window, missing = row
    if window is None:
        return LabelSettings(None, missing)
    query = select(LabelMaturityRow.matured_through).where(LabelMaturityRow.calibrator_id == calibrator_id)
    through = session.scalar(query.with_for_update() if lock else query)
    return LabelSettings(window, missing, through)


def set_settings(session: Session, name: str, window_seconds: float | None, missing: str, now: datetime) -> int:
    """Store the label settings of the calibrator named ``name``; returns its id."""
    calibrator_id = session.scalar(select(CalibratorRow.id).where(CalibratorRow.name == name))
    if calibrator_id is None:
        raise NotFound(name)
    apply_settings(session, calibrator_id, window_seconds, missing, now)
    return calibrator_id


def apply_settings(session: Session, calibrator_id: int, window_seconds: float | None, missing: str, now: datetime) -> None:
    """Store a calibrator's label settings. A window declared where there was none starts the cursor one
    window back: predictions served within the last window mature when it has passed since they were
    served; older ones were final on arrival. A changed window keeps the cursor."""
    previous = session.scalar(
        select(CalibratorRow.label_window_seconds).where(CalibratorRow.id == calibrator_id).with_for_update()
    )
    session.execute(
        update(CalibratorRow)
        .where(CalibratorRow.id == calibrator_id)
        .values(label_window_seconds=window_seconds, label_missing=missing)
    )
    if window_seconds is None or previous is not None:
        return
    start = now - timedelta(seconds=window_seconds)
    state = session.get(LabelMaturityRow, calibrator_id, with_for_update=True)
    if state is None:
        session.add(LabelMaturityRow(
            calibrator_id=calibrator_id, matured_through=start, late_labels=0, implied_negatives=0, unlabelled=0,
            updated_at=now,
        ))
    else:
        state.matured_through = max(state.matured_through, start)
        state.updated_at = now
    session.flush()


def read_settings(sessions: Sessions, calibrator_id: int) -> LabelSettings:
    with transaction(sessions) as session:
        return settings_of(session, calibrator_id) or LabelSettings()


def to_mature(session: Session) -> list[int]:
    """Calibrators the maturity step has work for: those with a window, and those with waiting rows
    (a window removed: its waiting rows mature at once)."""
    windowed = select(CalibratorRow.id).where(CalibratorRow.label_window_seconds.is_not(None))
    waiting = select(FeedbackRow.calibrator_id).where(FeedbackRow.waiting).distinct()
    return sorted(set(session.scalars(windowed)) | set(session.scalars(waiting)))


def claim(session: Session, calibrator_id: int) -> LabelMaturityRow | None:
    """Hold a calibrator's maturity row for this transaction (None: it has none)."""
    return session.scalars(
        select(LabelMaturityRow).where(LabelMaturityRow.calibrator_id == calibrator_id).with_for_update()
    ).first()


def batch_end(session: Session, calibrator_id: int, after: datetime, through: datetime, limit: int) -> datetime:
    """The prediction time up to which about ``limit`` predictions (logged or waiting) lie after ``after``:
    ``through``, or earlier for a large backlog (all predictions of that instant included)."""
    end = through
    logged = session.scalar(
        select(PredictionRow.created_at)
        .where(PredictionRow.calibrator_id == calibrator_id, PredictionRow.created_at > after,
               PredictionRow.created_at <= through)
        .order_by(PredictionRow.created_at)
        .offset(limit - 1)
        .limit(1)
    )
    if logged is not None:
        end = min(end, logged)
    waiting = session.scalar(
        select(FeedbackRow.predicted_at)
        .where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.waiting, FeedbackRow.predicted_at <= through)
        .order_by(FeedbackRow.predicted_at)
        .offset(limit - 1)
        .limit(1)
    )
    if waiting is not None:
        end = min(end, waiting)
    return end


#: The columns of a waiting row that its maturity needs.
WAITING_COLUMNS = (
    FeedbackRow.id, FeedbackRow.version, FeedbackRow.probability, FeedbackRow.label, FeedbackRow.probabilities,
    FeedbackRow.accepted, FeedbackRow.predicted_at, FeedbackRow.segments,
)


def waiting_rows(session: Session, calibrator_id: int, through: datetime | None, limit: int | None = None,
                 lock: bool = False) -> list[tuple]:
    """Waiting rows predicted up to ``through`` (None: all), in prediction-time order, at most ``limit``.
    ``lock``: held until the transaction ends, so that another process that reads them after this one
    has marked them mature skips them (PostgreSQL rechecks ``waiting`` once the lock is free)."""
    query = select(*WAITING_COLUMNS).where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.waiting)
    if through is not None:
        query = query.where(FeedbackRow.predicted_at <= through)
    query = query.order_by(FeedbackRow.predicted_at, FeedbackRow.id).limit(limit)
    return list(session.execute(query.with_for_update() if lock else query).all())


def mark_mature(session: Session, row_ids: list[int]) -> None:
    for start in range(0, len(row_ids), 5000):
        session.execute(update(FeedbackRow).where(FeedbackRow.id.in_(row_ids[start : start + 5000])).values(waiting=False))


def unlabelled_predictions(session: Session, calibrator_id: int, after: datetime, through: datetime) -> list[tuple]:
    """Logged predictions served in (after, through] without a label, in prediction-time order:
    (id, version, probability, probabilities, accepted, scores, segments, features, created_at).

    Index lookups, not one anti-join: with the feedback table's statistics stale (it grows by a batch
    of implied negatives a second), PostgreSQL's generic plan for the anti-join hashed every feedback
    row of the calibrator, spilling to disk for minutes a batch."""
    served = session.execute(
        select(
            PredictionRow.prediction_id, PredictionRow.version, PredictionRow.probability, PredictionRow.probabilities,
            PredictionRow.accepted, PredictionRow.scores, PredictionRow.segments, PredictionRow.features,
            PredictionRow.created_at,
        )
        .where(PredictionRow.calibrator_id == calibrator_id, PredictionRow.created_at > after,
               PredictionRow.created_at <= through)
        .order_by(PredictionRow.created_at, PredictionRow.id)
    ).all()
    labelled = _labelled(session, calibrator_id, [row[0] for row in served])
    return [row for row in served if row[0] not in labelled]


def _labelled(session: Session, calibrator_id: int, ids: list[str]) -> set[str]:
    """Which of ``ids`` have a feedback row."""
    if not ids:
        return set()
    if is_postgresql(session):
        # One array, unnested and joined: a loop of unique-index lookups in every plan. An IN list of
        # bind parameters is searched element by element for each row once the statement's plan is
        # generic (psycopg prepares it after a few runs): seconds a batch.
        return set(session.scalars(_LABELLED_OF, {"ids": ids, "calibrator": calibrator_id}))
    found: set[str] = set()
    for start in range(0, len(ids), 5000):  # SQLite: its IN list is an index of its own
        found.update(session.scalars(
            select(FeedbackRow.prediction_id)
            .where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.prediction_id.in_(ids[start : start + 5000]))
        ))
    return found


_LABELLED_OF = text(
    "SELECT f.prediction_id FROM unnest(CAST(:ids AS text[])) AS wanted(id) "
    f"JOIN {FeedbackRow.__tablename__} f ON f.calibrator_id = :calibrator AND f.prediction_id = wanted.id"
)


def count(session: Session, calibrator_id: int, late: int = 0, implied: int = 0, unlabelled: int = 0) -> None:
    """Add to a windowed calibrator's counters (its maturity row is held by the caller)."""
    if late or implied or unlabelled:
        session.execute(
            update(LabelMaturityRow)
            .where(LabelMaturityRow.calibrator_id == calibrator_id)
            .values(
                late_labels=LabelMaturityRow.late_labels + late,
                implied_negatives=LabelMaturityRow.implied_negatives + implied,
                unlabelled=LabelMaturityRow.unlabelled + unlabelled,
            )
        )


def add_delays(session: Session, calibrator_id: int, counts: dict[int, np.ndarray]) -> None:
    """Add label delay counts per label value and bin."""
    rows = [
        {"calibrator_id": calibrator_id, "label": label, "bin": int(b), "count": int(c[b])}
        for label, c in sorted(counts.items())
        for b in np.flatnonzero(c)
    ]
    if not rows:
        return
    statement = insert_for(session)(LabelDelayRow)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["calibrator_id", "label", "bin"], set_={"count": LabelDelayRow.count + statement.excluded.count}
        ),
        rows,
    )


@dataclass(frozen=True)
class Backlog:
    """What waits for maturity, and what maturity has counted."""

    settings: LabelSettings
    waiting_predictions: int
    waiting_labels: int
    late_labels: int
    implied_negatives: int
    unlabelled: int
    delays: dict[int, list[tuple[int, int]]]  # label -> [(bin, count)]
