"""Monitor state: bin sums per version and minute of prediction time, the drift tests' states, and the
windows read from them.

The monitors see mature predictions only (labels final on arrival, or past
their calibrator's label window), and their time axis is the prediction's
time: a bucket's minute is when its predictions were served.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..monitoring.windows import COUNT_WINDOWS, SUM_FIELDS, TIME_WINDOWS, BinSums, feedback_terms
from .db import transaction
from .models import DriftStateRow, FeedbackRow, MonitorBucketRow, utcnow
from .sql import Sessions, insert_for


def minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def add_to_buckets(session: Session, calibrator_id: int, version: int, bucket: datetime, sums: BinSums) -> None:
    rows = [{"calibrator_id": calibrator_id, "version": version, "bucket_start": bucket, **row} for row in sums.rows()]
    if not rows:
        return
    statement = insert_for(session)(MonitorBucketRow)
    statement = statement.on_conflict_do_update(
        index_elements=["calibrator_id", "version", "bucket_start", "bin"],
        set_={name: getattr(MonitorBucketRow, name) + getattr(statement.excluded, name) for name in SUM_FIELDS},
    )
    session.execute(statement, rows)


def lock_drift_state(session: Session, calibrator_id: int, version: int, now: datetime) -> DriftStateRow:
    """The drift test's row of one version, created if missing and locked: concurrent writers update
    the test one batch at a time."""
    session.execute(
        insert_for(session)(DriftStateRow)
        .values(calibrator_id=calibrator_id, version=version, state={}, alarm=False, log_evalue=0.0, updated_at=now)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "version"])
    )
    return session.scalars(
        select(DriftStateRow)
        .where(DriftStateRow.calibrator_id == calibrator_id, DriftStateRow.version == version)
        .with_for_update()
    ).one()


def window_sums(
    sessions: Sessions, calibrator_id: int, version: int, now: datetime | None = None
) -> dict[str, BinSums]:
    """Bin sums of every window of one version. Time windows end at ``now``: for a calibrator with a
    label window, pass the time up to which its predictions are mature."""
    now = now or utcnow()
    sums: dict[str, BinSums] = {}
    with transaction(sessions) as session:
        for window, length in TIME_WINDOWS.items():
            rows = session.execute(
                select(MonitorBucketRow.bin, *(func.sum(getattr(MonitorBucketRow, f)) for f in SUM_FIELDS))
                .where(
                    MonitorBucketRow.calibrator_id == calibrator_id,
                    MonitorBucketRow.version == version,
                    MonitorBucketRow.bucket_start > now - length,
                    MonitorBucketRow.bucket_start <= now,
                )
                .group_by(MonitorBucketRow.bin)
            ).all()
            sums[window] = BinSums.from_rows(rows)
        for window, limit in COUNT_WINDOWS.items():
            rows = session.execute(
                select(FeedbackRow.probability, FeedbackRow.label, FeedbackRow.probabilities, FeedbackRow.accepted)
                .where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.version == version, ~FeedbackRow.waiting)
                .order_by(FeedbackRow.predicted_at.desc(), FeedbackRow.id.desc())
                .limit(limit)
            ).all()
            sums[window] = sums_of_rows(rows)
    return sums


def sums_of_rows(rows: list[tuple]) -> BinSums:
    """Bin sums of feedback rows (probability, label, probabilities, accepted)."""
    if not rows:
        return BinSums()
    multiclass = rows[0][2] is not None
    labels = np.array([r[1] for r in rows], dtype=np.int64)
    if multiclass:
        probabilities = np.array([r[2] for r in rows], dtype=np.float64)
    else:
        probabilities = np.array([r[0] for r in rows], dtype=np.float64)
    accepted_values = [r[3] for r in rows]
    accepted = None if any(a is None for a in accepted_values) else np.array(accepted_values, dtype=bool)
    return BinSums.of(feedback_terms(probabilities, labels, accepted))


def drift_state(sessions: Sessions, calibrator_id: int, version: int) -> tuple[dict[str, Any], datetime | None]:
    """The stored state of one version's drift test ({} before its first batch) and when it changed."""
    with transaction(sessions) as session:
        row = session.get(DriftStateRow, (calibrator_id, version))
        return (row.state, row.updated_at) if row is not None else ({}, None)


def hourly_history(
    sessions: Sessions, calibrator_id: int, version: int, hours: int, now: datetime | None = None
) -> list[tuple[datetime, BinSums]]:
    """Bin sums per hour of prediction time over the ``hours`` hours before ``now``, oldest first."""
    now = now or utcnow()
    with transaction(sessions) as session:
        rows = session.execute(
            select(MonitorBucketRow.bucket_start, MonitorBucketRow.bin, *(getattr(MonitorBucketRow, f) for f in SUM_FIELDS))
            .where(
                MonitorBucketRow.calibrator_id == calibrator_id,
                MonitorBucketRow.version == version,
                MonitorBucketRow.bucket_start > now - timedelta(hours=hours),
            )
            .order_by(MonitorBucketRow.bucket_start)
        ).all()
    by_hour: dict[datetime, list[tuple]] = defaultdict(list)
    for bucket_start, *rest in rows:
        by_hour[bucket_start.replace(minute=0)].append(tuple(rest))
    return [(hour, BinSums.from_rows(group)) for hour, group in sorted(by_hour.items())]
