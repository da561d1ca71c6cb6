"""Monitor state: bin sums per version and minute of prediction time, the drift tests' states, and the
windows read from them.

``read_version`` and ``read_current`` read the monitors of one version, or of every calibrator's
current version, in one snapshot and a few set-based queries (see below).

The monitors see mature predictions only (labels final on arrival, or past
their calibrator's label window), and their time axis is the prediction's
time: a bucket's minute is when its predictions were served.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Integer, Select, String, and_, cast, func, literal, select, type_coerce, union_all
from sqlalchemy.orm import Session

from ..monitoring.windows import COUNT_WINDOWS, N_BINS, SUM_FIELDS, TIME_WINDOWS, BinSums, feedback_terms, group_sums
from .db import snapshot, transaction
from .maturity import Backlog, LabelSettings
from .models import (
    CalibratorRow, DriftStateRow, FeedbackRow, LabelDelayRow, LabelMaturityRow, MonitorBucketRow, PredictionRow,
    SegmentDriftStateRow, SegmentFeedbackRow, SegmentMonitorBucketRow, UTCDateTime, VersionRow, utcnow,
)
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


# -- one snapshot of many versions -----------------------------------------------------
# What /metrics, the monitor route and the report read: every part is one set-based query for all
# the versions read (not a few per version), and all run in one snapshot (``db.snapshot``), so a
# segment's sums and its drift test, or a window and the alarm beside it, come from one moment.
# Sums are kept as arrays (rows x SUM_FIELDS x bins) so that thousands of versions cost a few
# numpy operations, not Python per version.

#: (calibrator id, version)
Key = tuple[int, int]
#: The windows, in the order of a table's sums.
ALL_WINDOWS = (*TIME_WINDOWS, *COUNT_WINDOWS)


def _empty(n: int) -> dict[str, np.ndarray]:
    return {w: np.zeros((n, len(SUM_FIELDS), N_BINS)) for w in ALL_WINDOWS}


@dataclass
class MonitorTable:
    """The monitors of many versions at one moment: row i is version ``keys[i]``."""

    keys: list[Key]
    names: list[str]
    n_classes: np.ndarray
    labels: list[Backlog]
    #: window -> (rows, SUM_FIELDS, bins)
    sums: dict[str, np.ndarray]
    #: Each version's drift test row: alarm, log_evalue, updated_at, and (detailed reads) its state.
    drift: list[dict[str, Any]]
    #: Segments: (row of their version, dimension, segment), their drift rows (with alpha) and sums.
    segments: list[tuple[int, str, str]] = field(default_factory=list)
    segment_drift: list[dict[str, Any]] = field(default_factory=list)
    segment_sums: dict[str, np.ndarray] = field(default_factory=lambda: _empty(0))

    def windows_end(self, row: int) -> datetime | None:
        """Where row's time windows end: now (None), or (a label window) where predictions are mature."""
        settings = self.labels[row].settings
        return settings.matured_through if settings.window_seconds is not None else None


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
    labels: Backlog
    sums: dict[str, BinSums]
    drift: dict[str, Any]
    segments: dict[tuple[str, str], SegmentState]
    #: Bin sums per hour of prediction time, oldest first (only when asked for).
    history: list[tuple[datetime, BinSums]] = field(default_factory=list)


def read_version(
    sessions: Sessions, calibrator_id: int, version: int, history_hours: int = 0, now: datetime | None = None
) -> VersionState | None:
    """One version's monitors with their drift tests' states, and ``history_hours`` of hourly sums;
    None when the calibrator has no such version (deleted meanwhile)."""
    now = now or utcnow()
    with snapshot(sessions) as session:
        table = _read(session, _Scope(calibrator_id, version), now, detailed=True)
        if not table.keys:
            return None
        history = []
        if history_hours:
            history = _hourly(session, calibrator_id, version, history_hours, table.windows_end(0) or now)
    segments = {
        (dimension, segment): SegmentState({w: BinSums.from_table(table.segment_sums[w][j]) for w in ALL_WINDOWS}, drift)
        for j, ((_, dimension, segment), drift) in enumerate(zip(table.segments, table.segment_drift))
    }
    return VersionState(
        table.names[0], calibrator_id, version, int(table.n_classes[0]), table.labels[0],
        {w: BinSums.from_table(table.sums[w][0]) for w in ALL_WINDOWS}, table.drift[0], segments, history,
    )


def read_current(sessions: Sessions, now: datetime | None = None) -> MonitorTable:
    """The monitors of every calibrator's current version, by name (drift tests: alarm and log e-value)."""
    with snapshot(sessions) as session:
        return _read(session, _Scope(), now or utcnow(), detailed=False)


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

    def calibrators(self, query: Select, column) -> Select:
        """Rows of the calibrators read (tables keyed by calibrator only)."""
        if self.calibrator_id is not None:
            return query.where(column == self.calibrator_id)
        return query.join(CalibratorRow, and_(CalibratorRow.id == column, CalibratorRow.current_version.is_not(None)))


def _read(session: Session, scope: _Scope, now: datetime, detailed: bool) -> MonitorTable:
    connection = session.connection()
    C, V, M = CalibratorRow, VersionRow, LabelMaturityRow
    query = (
        select(C.name, V.calibrator_id, V.version, V.n_classes, C.label_window_seconds, C.label_missing,
               M.matured_through, M.late_labels, M.implied_negatives, M.unlabelled)
        .select_from(V)
        .outerjoin(M, M.calibrator_id == V.calibrator_id)
    )
    query = scope.where(query.join(C, C.id == V.calibrator_id), V) if scope.calibrator_id is not None else scope.where(query, V)
    rows = sorted(connection.execute(query).all(), key=lambda row: row[0])
    labels = [
        Backlog(LabelSettings(window, missing, through if window is not None else None), 0, 0,
                int(late or 0), int(implied or 0), int(unlabelled or 0), {})
        for _, _, _, _, window, missing, through, late, implied, unlabelled in rows
    ]
    keys = [(row[1], row[2]) for row in rows]
    table = MonitorTable(
        keys, [row[0] for row in rows], np.array([row[3] for row in rows], dtype=np.int64), labels, _empty(len(rows)),
        [_drift_row(False, 0.0, None, {} if detailed else None) for _ in rows],
    )
    if not rows:
        return table
    index = {key: i for i, key in enumerate(keys)}
    _read_label_timing(connection, scope, table, index)
    ends = {key: table.windows_end(i) or now for i, key in enumerate(keys)}

    B = MonitorBucketRow
    for window, length in TIME_WINDOWS.items():
        _time_window(connection, scope, B, (B.calibrator_id, B.version), ends, length, True, index, table.sums[window])
    F = FeedbackRow
    for window, limit in COUNT_WINDOWS.items():
        found = _newest(connection, scope, F, (F.calibrator_id, F.version), limit, ~F.waiting,
                        (F.predicted_at.desc(), F.id.desc()))
        _count_sums(found, 2, index, table.sums[window])
    D = DriftStateRow
    query = select(D.calibrator_id, D.version, D.alarm, D.log_evalue, D.updated_at, *((D.state,) if detailed else ()))
    for cid, version, alarm, log_evalue, updated_at, *stored in connection.execute(scope.where(query, D)):
        i = index.get((cid, version))
        if i is not None:
            table.drift[i] = _drift_row(alarm, log_evalue, updated_at, stored[0] if stored else None)
    _read_segments(connection, scope, ends, detailed, table, index)
    return table


def _drift_row(alarm: bool, log_evalue: float, updated_at: datetime | None, state: dict | None) -> dict[str, Any]:
    row = {"alarm": bool(alarm), "log_evalue": float(log_evalue), "updated_at": updated_at}
    if state is not None:
        row["state"] = state
    return row


def _read_label_timing(connection, scope: _Scope, table: MonitorTable, index: dict[Key, int]) -> None:
    """Each calibrator's label backlog (waiting labels and predictions) and label delays."""
    rows_of: dict[int, list[int]] = defaultdict(list)
    for (cid, _), i in index.items():
        rows_of[cid].append(i)

    def put(calibrator_id: int, **values) -> None:
        for i in rows_of.get(calibrator_id, ()):
            table.labels[i] = replace(table.labels[i], **values)

    F, P, M, C, L = FeedbackRow, PredictionRow, LabelMaturityRow, CalibratorRow, LabelDelayRow
    waiting = select(F.calibrator_id, func.count()).where(F.waiting)
    for cid, n in connection.execute(scope.calibrators(waiting, F.calibrator_id).group_by(F.calibrator_id)):
        put(cid, waiting_labels=int(n))
    if any(backlog.settings.window_seconds is not None for backlog in table.labels):
        # Predictions past the cursor of a calibrator with a label window.
        predictions = (
            select(P.calibrator_id, func.count())
            .join(M, and_(M.calibrator_id == P.calibrator_id, P.created_at > M.matured_through))
        )
        if scope.calibrator_id is None:
            predictions = predictions.join(C, and_(C.id == P.calibrator_id, C.current_version.is_not(None)))
        else:
            predictions = predictions.join(C, C.id == P.calibrator_id).where(P.calibrator_id == scope.calibrator_id)
        predictions = predictions.where(C.label_window_seconds.is_not(None)).group_by(P.calibrator_id)
        for cid, n in connection.execute(predictions):
            put(cid, waiting_predictions=int(n))
    delays: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(dict)
    for cid, label, b, c in connection.execute(scope.calibrators(select(L.calibrator_id, L.label, L.bin, L.count), L.calibrator_id)):
        delays[cid].setdefault(label, []).append((b, c))
    for cid, found in delays.items():
        put(cid, delays=found)


def _time_window(connection, scope: _Scope, table, keys: tuple, ends: dict[Key, datetime], length: timedelta,
                 bounded: bool, index: dict[tuple, int], out: np.ndarray) -> None:
    """Add bucket sums in ``(end - length, end]`` of each version (``bounded``: else no upper end) to
    ``out`` at ``index[key]`` (``keys``: the version's columns first). One query for the versions
    whose windows end at the same moment (all but those with a label window), one for the rest
    (their ends as a table of literals)."""
    by_end: dict[datetime, int] = defaultdict(int)
    for end in ends.values():
        by_end[end] += 1
    common = max(by_end, key=by_end.__getitem__)
    query = select(*keys, table.bin, *(func.sum(getattr(table, f)) for f in SUM_FIELDS))
    grouping = (*keys, table.bin)
    plain = table.bucket_start > common - length
    if bounded:
        plain = and_(plain, table.bucket_start <= common)
    rows = [row for row in connection.execute(scope.where(query.where(plain), table).group_by(*grouping))
            if ends.get((row[0], row[1])) == common]
    others = [(key, end) for key, end in ends.items() if end != common]
    for start in range(0, len(others), 1000):  # within every backend's limit on bound parameters
        ends_table = union_all(*(
            select(cast(literal(cid), Integer).label("cid"), cast(literal(version), Integer).label("version"),
                   literal(end - length, UTCDateTime).label("start"), literal(end, UTCDateTime).label("end"))
            for (cid, version), end in others[start : start + 1000]
        )).subquery("ends")
        match = and_(ends_table.c.cid == table.calibrator_id, ends_table.c.version == table.version,
                     table.bucket_start > ends_table.c.start)
        if bounded:
            match = and_(match, table.bucket_start <= ends_table.c.end)
        rows += connection.execute(query.join(ends_table, match).group_by(*grouping)).all()
    width = len(keys)
    rows = [row for row in rows if tuple(row[:width]) in index]
    if not rows:
        return
    at = np.fromiter((index[tuple(row[:width])] for row in rows), dtype=np.int64, count=len(rows))
    values = np.array([tuple(row[width:]) for row in rows], dtype=np.float64)
    bins = values[:, 0].astype(np.int64)
    for f in range(len(SUM_FIELDS)):  # each (row, bin) once: the query grouped by them
        out[at, f, bins] += values[:, 1 + f]


def _read_segments(connection, scope: _Scope, ends: dict[Key, datetime], detailed: bool, table: MonitorTable,
                   index: dict[Key, int]) -> None:
    D = SegmentDriftStateRow
    query = select(D.calibrator_id, D.version, D.dimension, D.segment, D.alpha, D.alarm, D.log_evalue, D.updated_at,
                   *((D.state,) if detailed else ()))
    found = sorted(
        (row for row in connection.execute(scope.where(query, D)) if (row[0], row[1]) in index),
        key=lambda row: (index[(row[0], row[1])], row[2], row[3]),
    )
    if not found:
        return
    segment_index = {}
    for cid, version, dimension, segment, alpha, alarm, log_evalue, updated_at, *stored in found:
        segment_index[(cid, version, dimension, segment)] = len(table.segments)
        table.segments.append((index[(cid, version)], dimension, segment))
        table.segment_drift.append(_drift_row(alarm, log_evalue, updated_at, stored[0] if stored else None) | {"alpha": float(alpha)})
    table.segment_sums = _empty(len(table.segments))
    # Only sums of a segment with its drift test count (both are written in one transaction).
    S = SegmentMonitorBucketRow
    segment_keys = (S.calibrator_id, S.version, S.dimension, S.segment)
    for window, length in TIME_WINDOWS.items():
        _time_window(connection, scope, S, segment_keys, ends, length, False, segment_index, table.segment_sums[window])
    G = SegmentFeedbackRow
    for window, limit in COUNT_WINDOWS.items():
        rows = _newest(connection, scope, G, (G.calibrator_id, G.version, G.dimension, G.segment), limit, None, (G.id.desc(),))
        _count_sums(rows, 4, segment_index, table.segment_sums[window])


def _newest(connection, scope: _Scope, table, partition: tuple, limit: int, where, order: tuple) -> list[tuple]:
    """The newest ``limit`` labelled rows ``(*partition, probability, label, probabilities, accepted)``
    of each partition, in one query (a window function on both backends). ``probabilities`` comes as
    its JSON text, decoded only where a row has it (multiclass)."""
    columns = (table.probability, table.label, type_coerce(table.probabilities, String).label("probabilities"), table.accepted)
    rank = func.row_number().over(partition_by=partition, order_by=order).label("rank")
    query = scope.where(select(*partition, *columns, rank), table)
    if where is not None:
        query = query.where(where)
    ranked = query.subquery()
    names = [column.key for column in (*partition, *columns)]
    return connection.execute(select(*(ranked.c[n] for n in names)).where(ranked.c.rank <= limit)).all()


def _count_sums(rows: list[tuple], width: int, index: dict[tuple, int], out: np.ndarray) -> None:
    """Add labelled rows ``(*key, probability, label, probabilities, accepted)`` to ``out`` at
    ``index[key]``: the keys whose rows are all binary without acceptance at once, the others one by one."""
    rows = [row for row in rows if tuple(row[:width]) in index]
    mixed = {tuple(row[:width]) for row in rows if row[width + 2] is not None or row[width + 3] is not None}
    plain = [row for row in rows if tuple(row[:width]) not in mixed] if mixed else rows
    if plain:
        at = np.fromiter((index[tuple(row[:width])] for row in plain), dtype=np.int64, count=len(plain))
        probability = np.fromiter((row[width] for row in plain), dtype=np.float64, count=len(plain))
        labels = np.fromiter((row[width + 1] for row in plain), dtype=np.int64, count=len(plain))
        out += group_sums(probability, labels, at, out.shape[0])
    others: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        key = tuple(row[:width])
        if key in mixed:
            probability, label, probabilities, accepted = row[width:]
            if isinstance(probabilities, (str, bytes)):  # SQLite's JSON text (PostgreSQL's driver decodes jsonb)
                probabilities = orjson.loads(probabilities)
            others[key].append((probability, label, probabilities, accepted))
    for key, group in others.items():
        out[index[key]] += sums_of_rows(group).table()


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
