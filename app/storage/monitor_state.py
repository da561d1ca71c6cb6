"""Monitor state read in one snapshot: window sums, drift tests and segments of one version, or of
every calibrator's current version at once.

Each part is one set-based query for all the versions read (not a few per version), and all of
them run in one snapshot (``db.snapshot``), so a segment's sums and its drift test, or a window
and the alarm beside it, always come from the same moment. This is what ``/metrics``, the
monitor route and the report read.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Select, and_, func, select
from sqlalchemy.orm import Session

from ..monitoring.drift import DriftTest
from ..monitoring.windows import COUNT_WINDOWS, SUM_FIELDS, TIME_WINDOWS, BinSums, feedback_terms
from .db import snapshot
from .models import (
    CalibratorRow, DriftStateRow, FeedbackRow, MonitorBucketRow, SegmentDriftStateRow, SegmentFeedbackRow,
    SegmentMonitorBucketRow, VersionRow, utcnow,
)
from .repository import Sessions

#: (calibrator id, version)
Key = tuple[int, int]
#: (dimension, segment)
SegmentKey = tuple[str, str]


@dataclass
class SegmentState:
    sums: dict[str, BinSums]
    drift: dict[str, Any]


@dataclass
class VersionState:
    """What the monitors of one version hold at one moment."""

    name: str
    calibrator_id: int
    version: int
    n_classes: int
    sums: dict[str, BinSums]
    drift: dict[str, Any]
    segments: dict[SegmentKey, SegmentState] = field(default_factory=dict)
    #: Bin sums per hour, oldest first (only when asked for).
    history: list[tuple[datetime, BinSums]] = field(default_factory=list)


def read_version(
    sessions: Sessions, calibrator_id: int, version: int, history_hours: int = 0, now: datetime | None = None
) -> VersionState | None:
    """One version's monitors, with full drift details and ``history_hours`` of hourly sums;
    None when the calibrator no longer has this version (deleted meanwhile)."""
    with snapshot(sessions) as session:
        states = _read(session, _Scope(calibrator_id, version), now or utcnow(), detailed=True)
        state = states.get((calibrator_id, version))
        if state is not None and history_hours:
            state.history = _hourly(session, calibrator_id, version, history_hours, now or utcnow())
    return state


def read_current(sessions: Sessions, now: datetime | None = None) -> list[VersionState]:
    """The monitors of every calibrator's current version, by name (alarm and log e-value of each drift test)."""
    with snapshot(sessions) as session:
        states = _read(session, _Scope(), now or utcnow(), detailed=False)
    return sorted(states.values(), key=lambda state: state.name)


def sums_of_rows(rows: list[tuple]) -> BinSums:
    """Bin sums of stored labelled rows ``(probability, label, probabilities, accepted)``."""
    if not rows:
        return BinSums()
    labels = np.array([r[1] for r in rows], dtype=np.int64)
    if rows[0][2] is not None:  # multiclass rows
        probabilities = np.array([r[2] for r in rows], dtype=np.float64)
    else:
        probabilities = np.array([r[0] for r in rows], dtype=np.float64)
    accepted_values = [r[3] for r in rows]
    accepted = None if any(a is None for a in accepted_values) else np.array(accepted_values, dtype=bool)
    return BinSums.of(feedback_terms(probabilities, labels, accepted))


# -- the queries ---------------------------------------------------------------------
@dataclass
class _Scope:
    """Which versions a query reads: one (calibrator id and version), or each calibrator's current one."""

    calibrator_id: int | None = None
    version: int | None = None

    def where(self, query: Select, table) -> Select:
        if self.calibrator_id is not None:
            return query.where(table.calibrator_id == self.calibrator_id, table.version == self.version)
        return query.join(
            CalibratorRow, and_(CalibratorRow.id == table.calibrator_id, CalibratorRow.current_version == table.version)
        )


def _read(session: Session, scope: _Scope, now: datetime, detailed: bool) -> dict[Key, VersionState]:
    versions = session.connection().execute(
        scope.where(select(CalibratorRow.name, VersionRow.calibrator_id, VersionRow.version, VersionRow.n_classes), VersionRow)
        .where(CalibratorRow.id == VersionRow.calibrator_id)
    ).all()
    states = {
        (cid, version): VersionState(name, cid, version, n_classes, {}, _drift({}, None, detailed))
        for name, cid, version, n_classes in versions
    }
    if not states:
        return states
    empty = {w: BinSums() for w in (*TIME_WINDOWS, *COUNT_WINDOWS)}
    for state in states.values():
        state.sums = dict(empty)

    B = MonitorBucketRow
    for window, length in TIME_WINDOWS.items():
        query = select(B.calibrator_id, B.version, B.bin, *(func.sum(getattr(B, f)) for f in SUM_FIELDS))
        rows = session.connection().execute(
            scope.where(query, B).where(B.bucket_start > now - length).group_by(B.calibrator_id, B.version, B.bin)
        ).all()
        for key, sums in _bucket_sums(rows, 2).items():
            if key in states:
                states[key].sums[window] = sums
    F = FeedbackRow
    for window, limit in COUNT_WINDOWS.items():
        columns = (F.probability, F.label, F.probabilities, F.accepted)
        for key, sums in _count_sums(_newest(session, scope, F, (F.calibrator_id, F.version), columns, limit), 2).items():
            if key in states:
                states[key].sums[window] = sums
    drift_columns = (DriftStateRow.state,) if detailed else ()
    query = select(DriftStateRow.calibrator_id, DriftStateRow.version, DriftStateRow.alarm, DriftStateRow.log_evalue,
                   DriftStateRow.updated_at, *drift_columns)
    for cid, version, alarm, log_evalue, updated_at, *state in session.connection().execute(scope.where(query, DriftStateRow)).all():
        if (cid, version) in states:
            states[(cid, version)].drift = _drift(
                state[0] if state else None, updated_at, detailed, alarm=alarm, log_evalue=log_evalue
            )
    _read_segments(session, scope, now, detailed, states)
    return states


def _read_segments(session: Session, scope: _Scope, now: datetime, detailed: bool, states: dict[Key, VersionState]) -> None:
    D = SegmentDriftStateRow
    columns = (D.state,) if detailed else ()
    rows = session.connection().execute(
        scope.where(select(D.calibrator_id, D.version, D.dimension, D.segment, D.alpha, D.alarm, D.log_evalue,
                           D.updated_at, *columns), D)
    ).all()
    if not rows:
        return
    for cid, version, dimension, segment, alpha, alarm, log_evalue, updated_at, *state in rows:
        if (cid, version) not in states:
            continue
        drift = _drift(state[0] if state else None, updated_at, detailed, alarm=alarm, log_evalue=log_evalue)
        drift["threshold"] = float(-np.log(alpha)) if alpha > 0 else None
        drift["alpha"] = float(alpha)
        states[(cid, version)].segments[(dimension, segment)] = SegmentState(
            {w: BinSums() for w in (*TIME_WINDOWS, *COUNT_WINDOWS)}, drift
        )

    def put(key: tuple, window: str, sums: BinSums) -> None:
        state = states.get(key[:2])
        segment = None if state is None else state.segments.get(key[2:])
        if segment is not None:  # sums of a segment have their drift test (written in one transaction)
            segment.sums[window] = sums

    S = SegmentMonitorBucketRow
    for window, length in TIME_WINDOWS.items():
        query = select(S.calibrator_id, S.version, S.dimension, S.segment, S.bin, *(func.sum(getattr(S, f)) for f in SUM_FIELDS))
        found = session.connection().execute(
            scope.where(query, S).where(S.bucket_start > now - length)
            .group_by(S.calibrator_id, S.version, S.dimension, S.segment, S.bin)
        ).all()
        for key, sums in _bucket_sums(found, 4).items():
            put(key, window, sums)
    F = SegmentFeedbackRow
    for window, limit in COUNT_WINDOWS.items():
        partition = (F.calibrator_id, F.version, F.dimension, F.segment)
        columns = (F.probability, F.label, F.probabilities, F.accepted)
        for key, sums in _count_sums(_newest(session, scope, F, partition, columns, limit), 4).items():
            put(key, window, sums)


def _newest(session: Session, scope: _Scope, table, partition: tuple, columns: tuple, limit: int) -> list[tuple]:
    """The newest ``limit`` rows of each partition, in one query (a window function on both backends)."""
    rank = func.row_number().over(partition_by=partition, order_by=table.id.desc()).label("rank")
    ranked = scope.where(select(*partition, *columns, rank), table).subquery()
    names = [column.key for column in (*partition, *columns)]
    return session.connection().execute(select(*(ranked.c[n] for n in names)).where(ranked.c.rank <= limit)).all()


def _bucket_sums(rows: list[tuple], width: int) -> dict[tuple, BinSums]:
    """Summed bucket rows ``(*key, bin, *SUM_FIELDS)`` as BinSums by key (the first ``width`` columns)."""
    if not rows:
        return {}
    keys: dict[tuple, int] = {}
    groups = np.array([keys.setdefault(tuple(row[:width]), len(keys)) for row in rows], dtype=np.int64)
    bins = np.array([row[width] for row in rows], dtype=np.int64)
    values = np.array([row[width + 1:] for row in rows], dtype=np.float64)
    return dict(zip(keys, BinSums.from_group_rows(groups, bins, values, len(keys))))


def _count_sums(rows: list[tuple], width: int) -> dict[tuple, BinSums]:
    """Stored labelled rows ``(*key, probability, label, probabilities, accepted)`` as BinSums by key:
    binary rows without acceptance for all keys at once, the others key by key."""
    grouped = _grouped(rows, width)
    plain = [key for key, group in grouped.items() if all(r[2] is None and r[3] is None for r in group)]
    plain_keys = set(plain)
    out = {key: sums_of_rows(group) for key, group in grouped.items() if key not in plain_keys}
    if plain:
        groups = np.concatenate([np.full(len(grouped[key]), g, dtype=np.int64) for g, key in enumerate(plain)])
        probability = np.array([r[0] for key in plain for r in grouped[key]], dtype=np.float64)
        labels = np.array([r[1] for key in plain for r in grouped[key]], dtype=np.int64)
        out.update(zip(plain, BinSums.of_groups(probability, labels, groups, len(plain))))
    return out


def _grouped(rows: list[tuple], width: int) -> dict[tuple, list[tuple]]:
    """Rows grouped by their first ``width`` columns."""
    out: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        out[tuple(row[:width])].append(tuple(row[width:]))
    return out


def _drift(state: dict | None, updated_at: datetime | None, detailed: bool, alarm: bool = False, log_evalue: float = 0.0) -> dict:
    """A drift test as the routes show it; without ``detailed``, only its alarm and log e-value
    (which the feedback transaction stores beside the state)."""
    if not detailed:
        return {"alarm": bool(alarm), "log_evalue": float(log_evalue)}
    if not state:
        return {"alarm": False, "log_evalue": 0.0, "samples": 0, "batches": 0, "alarm_batch": None,
                "top_alternative": None, "updated_at": None}
    result = DriftTest.from_dict(state).result()
    return {
        "alarm": result.alarm,
        "log_evalue": result.log_evalue,
        "samples": result.n_samples,
        "batches": result.n_batches,
        "alarm_batch": result.alarm_batch,
        "top_alternative": result.top_alternative,
        "updated_at": updated_at,
    }


def _hourly(session: Session, calibrator_id: int, version: int, hours: int, now: datetime) -> list[tuple[datetime, BinSums]]:
    B = MonitorBucketRow
    rows = session.connection().execute(
        select(B.bucket_start, B.bin, *(getattr(B, f) for f in SUM_FIELDS))
        .where(B.calibrator_id == calibrator_id, B.version == version, B.bucket_start > now - timedelta(hours=hours))
        .order_by(B.bucket_start)
    ).all()
    by_hour: dict[datetime, list[tuple]] = defaultdict(list)
    for bucket_start, *rest in rows:
        by_hour[bucket_start.replace(minute=0)].append(tuple(rest))
    return [(hour, BinSums.from_rows(group)) for hour, group in sorted(by_hour.items())]
