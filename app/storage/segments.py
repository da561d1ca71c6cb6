"""Segments: a calibrator's declared dimensions, its tracked values, and per-segment monitor state.

Labelled rows with segment values are added, in the feedback transaction, to
the monitor sums, the count-window rows and the drift test of their segment in
every declared dimension (``calibd.monitoring.segments`` says which segment;
``calibd.monitoring.segment_drift`` what start mass each test gets). A segment
row's ``alpha`` holds the share of alpha its test has received so far, so the
version's rows sum to what the family has given out. The declaration row is
locked while a batch is assigned, so that two replicas never track more than
``max_values`` values of a dimension, nor give out more than alpha.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ..monitoring import segments as core
from ..monitoring.segment_drift import SegmentDriftTest, start_mass
from ..monitoring.windows import SUM_FIELDS, BinSums, FeedbackTerms
from .db import transaction
from .models import (
    CalibratorRow, SegmentDeclarationRow, SegmentDriftStateRow, SegmentFeedbackRow, SegmentMonitorBucketRow,
    SegmentValueRow, utcnow,
)
from .sql import NotFound, Sessions

def _calibrator_id(session: Session, name: str) -> int:
    calibrator_id = session.scalar(select(CalibratorRow.id).where(CalibratorRow.name == name))
    if calibrator_id is None:
        raise NotFound(name)
    return calibrator_id


def declaration(session: Session, calibrator_id: int, lock: bool = False) -> dict[str, Any] | None:
    query = select(SegmentDeclarationRow).where(SegmentDeclarationRow.calibrator_id == calibrator_id)
    row = session.scalars(query.with_for_update() if lock else query).first()
    return None if row is None else {"dimensions": list(row.dimensions), "max_values": int(row.max_values)}


def read_declaration(sessions: Sessions, calibrator_id: int) -> dict[str, Any] | None:
    with transaction(sessions) as session:
        return declaration(session, calibrator_id)


def declare(session: Session, calibrator_id: int, value: dict[str, Any] | None, now: datetime | None = None) -> None:
    """Set (or with None remove) a calibrator's declaration, in the caller's transaction."""
    row = session.get(SegmentDeclarationRow, calibrator_id)
    if value is None:
        if row is not None:
            session.delete(row)
        return
    if row is None:
        row = SegmentDeclarationRow(calibrator_id=calibrator_id)
        session.add(row)
    row.dimensions = value["dimensions"]
    row.max_values = value["max_values"]
    row.updated_at = now or utcnow()
    session.flush()


def set_declaration(sessions: Sessions, name: str, value: dict[str, Any] | None) -> None:
    with transaction(sessions) as session:
        declare(session, _calibrator_id(session, name), value)


def get_declaration(sessions: Sessions, name: str) -> tuple[int, dict[str, Any] | None, dict[str, list[str]]]:
    """The calibrator's id, its declaration, and the values tracked per dimension (in the order first met)."""
    with transaction(sessions) as session:
        calibrator_id = _calibrator_id(session, name)
        return calibrator_id, declaration(session, calibrator_id), _tracked(session, calibrator_id)


def _tracked(session: Session, calibrator_id: int) -> dict[str, list[str]]:
    rows = session.execute(
        select(SegmentValueRow.dimension, SegmentValueRow.value)
        .where(SegmentValueRow.calibrator_id == calibrator_id)
        .order_by(SegmentValueRow.dimension, SegmentValueRow.rank)
    ).all()
    out: dict[str, list[str]] = defaultdict(list)
    for dimension, value in rows:
        out[dimension].append(value)
    return dict(out)


def _subset(terms: FeedbackTerms, rows: np.ndarray) -> FeedbackTerms:
    return FeedbackTerms(
        terms.probability[rows], terms.outcome[rows], terms.brier[rows], terms.log_loss[rows],
        None if terms.accepted is None else terms.accepted[rows],
    )


def store(
    session: Session, calibrator_id: int, version: int, bucket: datetime, now: datetime,
    segments: dict[str, np.ndarray], terms: FeedbackTerms, labels: np.ndarray, rows_probabilities: np.ndarray | None,
    alpha: float, tolerance: float, insert,
) -> None:
    """Add labelled rows to their segments' sums, count windows and drift tests (the caller's transaction).

    ``segments`` maps a dimension to the rows' values (None: no value). Values
    of dimensions no longer declared are ignored.
    """
    declared = declaration(session, calibrator_id, lock=True)
    if declared is None:
        return
    tracked = _tracked(session, calibrator_id)
    spent = float(
        session.scalar(
            select(func.coalesce(func.sum(SegmentDriftStateRow.alpha), 0.0)).where(
                SegmentDriftStateRow.calibrator_id == calibrator_id, SegmentDriftStateRow.version == version
            )
        )
    )
    # The batch's start mass (a share of the family's budget), 1/D to each dimension, by labels.
    n = labels.shape[0]
    batch_mass = start_mass(min(1.0, spent / alpha), n) / len(declared["dimensions"])
    for dimension in declared["dimensions"]:
        if dimension not in segments:
            continue
        known = tracked.get(dimension, [])
        assigned, new = core.assign(np.asarray(segments[dimension], dtype=object), known, declared["max_values"])
        if new:
            session.execute(
                insert(SegmentValueRow),
                [
                    {"calibrator_id": calibrator_id, "dimension": dimension, "value": value, "rank": len(known) + i}
                    for i, value in enumerate(new)
                ],
            )
        for segment in dict.fromkeys(v for v in assigned.tolist() if v is not None):
            rows = np.flatnonzero(assigned == segment)
            part = _subset(terms, rows)
            key = {"calibrator_id": calibrator_id, "version": version, "dimension": dimension, "segment": segment}
            _add_to_buckets(session, insert, key, bucket, BinSums.of(part))
            session.execute(
                insert(SegmentFeedbackRow),
                [
                    key | {
                        "probability": p, "label": y, "accepted": a, "received_at": now,
                        "probabilities": None if rows_probabilities is None else rows_probabilities[i].tolist(),
                    }
                    for i, p, y, a in zip(
                        rows.tolist(), part.probability.tolist(), labels[rows].tolist(),
                        [None] * rows.shape[0] if part.accepted is None else part.accepted.tolist(),
                    )
                ],
            )
            kept = np.ones(rows.shape[0], dtype=bool) if part.accepted is None else part.accepted.astype(bool)
            _update_drift(
                session, key, part.probability[kept], part.outcome[kept], now,
                batch_mass * rows.shape[0] / n, alpha, tolerance,
            )


def _add_to_buckets(session: Session, insert, key: dict, bucket: datetime, sums: BinSums) -> None:
    rows = [key | {"bucket_start": bucket, **row} for row in sums.rows()]
    if not rows:
        return
    statement = insert(SegmentMonitorBucketRow)
    statement = statement.on_conflict_do_update(
        index_elements=["calibrator_id", "version", "dimension", "segment", "bucket_start", "bin"],
        set_={name: getattr(SegmentMonitorBucketRow, name) + getattr(statement.excluded, name) for name in SUM_FIELDS},
    )
    session.execute(statement, rows)


def _update_drift(session: Session, key: dict, p: np.ndarray, y: np.ndarray, now: datetime,
                  mass: float, alpha: float, tolerance: float) -> None:
    """Give the segment's test its start mass and feed it the segment's rows.

    A state of the earlier design (each test its own fixed alpha) keeps the
    alpha it was given and its alarm, and the segment goes on with a new test
    funded from what is left of the budget.
    """
    row = session.get(
        SegmentDriftStateRow, (key["calibrator_id"], key["version"], key["dimension"], key["segment"]),
        with_for_update=True,
    )
    if row is None:
        row = SegmentDriftStateRow(**key, alpha=0.0, state={}, alarm=False, log_evalue=0.0, updated_at=now)
        session.add(row)
    row.updated_at = now
    if mass <= 0.0 or p.shape[0] == 0:
        return
    known = SegmentDriftTest.is_state(row.state)
    test = SegmentDriftTest.from_dict(row.state) if known else SegmentDriftTest(alpha=alpha, tolerance=tolerance)
    result = test.update(p, y.astype(np.int8), mass)
    row.state = test.to_dict()
    row.alarm = bool(row.alarm) or bool(result.alarm)  # latched, across a change of design too
    row.log_evalue = float(result.log_evalue)
    row.alpha = float(row.alpha) + alpha * mass
    session.flush()


def purge(session: Session, oldest: datetime) -> dict[str, int]:
    return {
        "segment_feedback": session.execute(delete(SegmentFeedbackRow).where(SegmentFeedbackRow.received_at < oldest)).rowcount,
        "segment_monitor_buckets": session.execute(
            delete(SegmentMonitorBucketRow).where(SegmentMonitorBucketRow.bucket_start < oldest)
        ).rowcount,
    }
