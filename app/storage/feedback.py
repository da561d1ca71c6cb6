"""Feedback, logged predictions and monitor state: the functions that read and write them.

A feedback request commits in one transaction: its labelled rows, the monitor
sums of their minute and bins, the drift test's new state, its pending labels,
and the idempotency record. Either all of it is stored, or none.

One label per prediction id, the first received: the unique index on
feedback (calibrator_id, prediction_id) holds it on every backend and across
processes, and rows are inserted with ON CONFLICT DO NOTHING, so only the
rows that went in are added to the monitor sums and the drift test. Labels
for ids not logged yet wait in pending_labels (also unique by id) until the
log writer or a sweep joins them.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import orjson
from sqlalchemy import String, any_, bindparam, delete, func, null, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from ..calibration.columns import Columns
from ..monitoring.drift import DriftTest
from ..monitoring.windows import COUNT_WINDOWS, SUM_FIELDS, TIME_WINDOWS, BinSums, FeedbackTerms, feedback_terms
from . import segments as segment_store
from .db import transaction
from .models import (
    CalibratorRow, DriftStateRow, FeedbackRow, IdempotencyRow, MonitorBucketRow, PendingLabelRow, PredictionRow, utcnow,
)
from .repository import NotFound, Sessions, hold_calibrator

logger = logging.getLogger("calibd")

# Ids are looked up in chunks, within every backend's limit on bound parameters.
_ID_CHUNK = 5000


def _insert(session: Session):
    return postgresql_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


@dataclass(frozen=True)
class DriftSettings:
    alpha: float
    tolerance: float


@dataclass
class LabelledBatch:
    """Validated labelled predictions of one version."""

    version: int
    probabilities: np.ndarray  # (n,) probability of class 1, or (n, K) rows
    labels: np.ndarray  # ints
    prediction_ids: list[str] | None = None
    accepted: np.ndarray | None = None
    #: The raw scores behind the probabilities, when known (a refit learns from them).
    scores: list | None = None
    #: Segment values per dimension (object arrays; None where a row has no value).
    segments: dict[str, np.ndarray] | None = None
    #: Feature-taking methods: each row's features ({"country": "br", "age": 31.0}, or None), kept for refits.
    features: list[dict[str, Any] | None] | None = None

    def first_of_each_id(self) -> tuple[LabelledBatch, list[str]]:
        """The batch with each prediction id's first row only, and the ids of the rows left out."""
        if self.prediction_ids is None:
            return self, []
        seen: set[str] = set()
        keep = np.ones(len(self.prediction_ids), dtype=bool)
        for position, prediction_id in enumerate(self.prediction_ids):
            keep[position] = prediction_id not in seen
            seen.add(prediction_id)
        if keep.all():
            return self, []
        return self.subset(keep), [i for i, kept in zip(self.prediction_ids, keep) if not kept]

    def subset(self, keep: np.ndarray) -> LabelledBatch:
        """The rows where ``keep`` is true."""
        positions = np.flatnonzero(keep)
        return LabelledBatch(
            self.version,
            self.probabilities[keep],
            self.labels[keep],
            prediction_ids=None if self.prediction_ids is None else [self.prediction_ids[i] for i in positions],
            accepted=None if self.accepted is None else self.accepted[keep],
            scores=None if self.scores is None else [self.scores[i] for i in positions],
            segments=None if self.segments is None else {k: v[keep] for k, v in self.segments.items()},
            features=None if self.features is None else [self.features[i] for i in positions],
        )


@dataclass
class LoggedPrediction:
    version: int
    probabilities: np.ndarray | float
    accepted: bool | None
    scores: Any
    created_at: datetime
    segments: dict[str, str] | None = None
    features: dict[str, Any] | None = None


def feature_rows(columns: Columns) -> list[dict[str, Any]]:
    """Validated feature columns as one {column: value} per row, as stored (a missing number is null)."""
    names = list(columns.columns)
    values = [
        column.tolist() if column.dtype == object else [None if v != v else v for v in column.tolist()]
        for column in columns.columns.values()
    ]
    return [dict(zip(names, row)) for row in zip(*values)]


# -- predictions logged by /calibrate -------------------------------------------
def log_predictions(sessions: Sessions, rows: list[dict[str, Any]], join: PendingJoin | None = None) -> JoinCounts:
    """Insert logged predictions in one batch; an id already logged keeps its first prediction.

    With ``join``, labels that arrived before their prediction are joined in
    the same transaction (one cheap query when no label is pending).
    """
    counts = JoinCounts()
    if not rows:
        return counts
    with transaction(sessions) as session:
        if session.get_bind().dialect.name == "postgresql":
            _insert_predictions_unnest(session, rows)
        else:
            statement = _insert(session)(PredictionRow).on_conflict_do_nothing(
                index_elements=["calibrator_id", "prediction_id"]
            )
            session.execute(statement, rows)
        if join is not None and any_pending(session):
            # In a savepoint: if the join fails (a deadlock with a concurrent join, say), the
            # predictions are still written, and the next sweep joins their labels.
            try:
                with session.begin_nested():
                    counts = join_pending(session, join, utcnow())
            except DBAPIError as error:
                logger.warning("prediction log: pending labels left to the sweep: %s", error)
                counts = JoinCounts()
    return counts


_PREDICTIONS_UNNEST = text(
    f"INSERT INTO {PredictionRow.__tablename__} "
    "(calibrator_id, version, prediction_id, probability, probabilities, accepted, scores, segments, features, created_at) "
    "SELECT * FROM unnest(CAST(:calibrator_id AS integer[]), CAST(:version AS integer[]), CAST(:prediction_id AS text[]), "
    "CAST(:probability AS double precision[]), CAST(:probabilities AS jsonb[]), CAST(:accepted AS boolean[]), "
    "CAST(:scores AS jsonb[]), CAST(:segments AS jsonb[]), CAST(:features AS jsonb[]), CAST(:created_at AS timestamptz[])) "
    "ON CONFLICT (calibrator_id, prediction_id) DO NOTHING"
)


def _insert_predictions_unnest(session: Session, rows: list[dict[str, Any]]) -> None:
    """All rows in one INSERT ... SELECT FROM unnest(one array per column) (PostgreSQL).

    The same rows and conflict rule as the executemany it replaces, which sends
    one INSERT per row (about 70 us each here): the prediction log of a busy
    /calibrate writes tens of thousands of rows a second.
    """

    def json_texts(key: str) -> list[str | None]:
        return [None if row.get(key) is None else _json_dumps(row[key]).decode() for row in rows]

    session.execute(
        _PREDICTIONS_UNNEST,
        {
            "calibrator_id": [row["calibrator_id"] for row in rows],
            "version": [row["version"] for row in rows],
            "prediction_id": [row["prediction_id"] for row in rows],
            "probability": [row["probability"] for row in rows],
            "probabilities": json_texts("probabilities"),
            "accepted": [row["accepted"] for row in rows],
            "scores": json_texts("scores"),
            "segments": json_texts("segments"),
            "features": json_texts("features"),
            "created_at": [row["created_at"] for row in rows],
        },
    )


def find_predictions(session: Session, calibrator_id: int, ids: list[str]) -> dict[str, LoggedPrediction]:
    found: dict[str, LoggedPrediction] = {}
    unique = list(dict.fromkeys(ids))
    columns = (
        PredictionRow.prediction_id,
        PredictionRow.version,
        PredictionRow.probability,
        PredictionRow.probabilities,
        PredictionRow.accepted,
        PredictionRow.scores,
        PredictionRow.created_at,
        PredictionRow.segments,
        PredictionRow.features,
    )
    if session.get_bind().dialect.name == "postgresql":
        # One array parameter, = ANY(:ids): an IN list of 5,000 bound parameters costs
        # SQLAlchemy and psycopg more time to compile and send than the lookup itself.
        queries = [
            select(*columns).where(
                PredictionRow.calibrator_id == calibrator_id,
                PredictionRow.prediction_id == any_(bindparam("ids", unique, type_=postgresql.ARRAY(String))),
            )
        ]
    else:
        queries = [
            select(*columns).where(
                PredictionRow.calibrator_id == calibrator_id, PredictionRow.prediction_id.in_(unique[start : start + _ID_CHUNK])
            )
            for start in range(0, len(unique), _ID_CHUNK)
        ]
    for query in queries:
        rows = session.execute(query).all()
        for prediction_id, version, probability, probabilities, accepted, scores, created_at, segments, features in rows:
            value = probability if probabilities is None else np.asarray(probabilities, dtype=np.float64)
            found[prediction_id] = LoggedPrediction(version, value, accepted, scores, created_at, segments, features)
    return found


# -- feedback ----------------------------------------------------------------------
@dataclass(frozen=True)
class StoredRequest:
    """The answer given to a request with an Idempotency-Key, and the digest of that request."""

    response: dict[str, Any]
    request_sha256: str | None

    def same_request(self, request_sha256: str | None) -> bool:
        # Keys stored before digests were kept match any body, as they did then.
        return self.request_sha256 is None or request_sha256 is None or self.request_sha256 == request_sha256


def stored_response(sessions: Sessions, key: str) -> StoredRequest | None:
    """The answer already given to a request with this Idempotency-Key, if any."""
    with transaction(sessions) as session:
        row = session.execute(
            select(IdempotencyRow.response, IdempotencyRow.request_sha256).where(IdempotencyRow.key == key)
        ).first()
    return None if row is None else StoredRequest(row[0], row[1])


class IdempotencyConflict(Exception):
    """Another request with the same Idempotency-Key committed first."""


@dataclass
class JoinCounts:
    """What a join did, by calibrator name: labels joined, duplicates dropped, labels gone unmatched."""

    joined: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    duplicates: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unmatched: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __bool__(self) -> bool:
        return any(self.joined.values()) or any(self.duplicates.values()) or any(self.unmatched.values())


@dataclass(frozen=True)
class PendingJoin:
    """How pending labels are joined: the drift test's settings, the prediction TTL, and the grace period."""

    drift: DriftSettings
    prediction_ttl: timedelta
    grace: timedelta


def record_feedback(
    sessions: Sessions,
    *,
    calibrator_id: int,
    batches: list[LabelledBatch] | None = None,
    ids: list[str] | None = None,
    labels: np.ndarray | None = None,
    segments: dict[str, np.ndarray] | None = None,
    prediction_ttl: timedelta,
    drift: DriftSettings,
    idempotency_key: str | None = None,
    request_sha256: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Record labelled predictions, given directly (``batches``) or by logged id (``ids``, ``labels``).

    One label per prediction id, the first one received: a label for an id
    already labelled (or already waiting as a pending label, or repeated in
    the request) is not recorded and is listed in ``duplicate_ids``. The
    unique index on (calibrator, prediction id) enforces it across processes.
    A label for an id not in the prediction log yet is stored as a pending
    label (listed in ``unknown_ids`` and counted in ``pending``), joined when
    its prediction is written. ``segments`` (with ``ids``): segment values per
    dimension for the labelled rows, over those logged with their predictions.

    Returns the receipt. With an ``idempotency_key`` the receipt and the
    request's digest are stored in the same transaction; a concurrent request
    with the same key raises IdempotencyConflict (its receipt is then
    ``stored_response(key)``).
    """
    now = now or utcnow()
    for attempt in range(_ATTEMPTS):
        try:
            return _record(sessions, calibrator_id, batches, ids, labels, prediction_ttl, drift, idempotency_key,
                           request_sha256, now, segments)
        except OperationalError as error:
            # A deadlock the sorted inserts do not rule out (pending labels claimed by a request
            # and a sweep at once, say): the loser was rolled back whole, and runs again once the
            # winner is likely done.
            if attempt + 1 == _ATTEMPTS or getattr(error.orig, "sqlstate", None) not in _RETRYABLE:
                raise
            time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
    raise AssertionError("unreachable")


#: Deadlock detected, serialization failure: the transaction was rolled back and can run again.
_RETRYABLE = ("40P01", "40001")
_ATTEMPTS = 3


def _record(
    sessions: Sessions, calibrator_id: int, batches: list[LabelledBatch] | None, ids: list[str] | None,
    labels: np.ndarray | None, prediction_ttl: timedelta, drift: DriftSettings, idempotency_key: str | None,
    request_sha256: str | None, now: datetime, segments: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    try:
        with transaction(sessions) as session:
            receipt = {"count": 0, "pending": 0, "unknown_ids": [], "expired_ids": [], "duplicate_ids": []}
            if ids is not None:
                batches = _labels_by_id(session, calibrator_id, ids, labels, now, prediction_ttl, receipt, segments)
            for batch in batches or []:
                batch, repeated = batch.first_of_each_id()
                receipt["duplicate_ids"] += repeated
                stored = _store_batch(session, calibrator_id, batch, now, drift)
                receipt["count"] += stored.joined
                receipt["duplicate_ids"] += stored.duplicate_ids
            _in_request_order(receipt, ids if ids is not None else [i for b in batches or [] for i in b.prediction_ids or []])
            if idempotency_key is not None:
                session.add(
                    IdempotencyRow(
                        key=idempotency_key, calibrator_id=calibrator_id, response=receipt,
                        request_sha256=request_sha256, created_at=now,
                    )
                )
                session.flush()
            return receipt
    except IntegrityError:
        if idempotency_key is not None and stored_response(sessions, idempotency_key) is not None:
            raise IdempotencyConflict(idempotency_key) from None
        raise


def _in_request_order(receipt: dict[str, Any], request_ids: list[str]) -> None:
    """Sort the receipt's id lists as the ids first appear in the request."""
    order: dict[str, int] = {}
    for position, prediction_id in enumerate(request_ids):
        order.setdefault(prediction_id, position)
    for key in ("unknown_ids", "expired_ids", "duplicate_ids"):
        if len(receipt[key]) > 1:
            receipt[key].sort(key=order.__getitem__)


def _labels_by_id(
    session: Session, calibrator_id: int, ids: list[str], labels: np.ndarray, now: datetime, ttl: timedelta,
    receipt: dict[str, Any], segments: dict[str, np.ndarray] | None = None,
) -> list[LabelledBatch]:
    """Labels for logged ids as batches to store; the others pending, expired or duplicate (in ``receipt``)."""
    first: dict[str, int] = {}
    for position, prediction_id in enumerate(ids):
        if prediction_id in first:
            receipt["duplicate_ids"].append(prediction_id)
        else:
            first[prediction_id] = position
    label_of = {prediction_id: int(labels[position]) for prediction_id, position in first.items()}
    logged = find_predictions(session, calibrator_id, list(first))
    # A label that waited for this prediction came first: it is the one joined, this one is the duplicate.
    waited = _claim_pending(session, calibrator_id, [i for i in first if i in logged]) if any_pending(session) else []
    for prediction_id, label in waited:
        receipt["duplicate_ids"].append(prediction_id)
        label_of[prediction_id] = label
    missing = [i for i in first if i not in logged]
    if missing:
        waiting = set(_add_pending(session, calibrator_id, missing, label_of, now))
        receipt["unknown_ids"] += [i for i in missing if i in waiting]
        receipt["duplicate_ids"] += [i for i in missing if i not in waiting]
        receipt["pending"] = len(waiting)
    given = None
    if segments:
        given = {i: {k: v[position] for k, v in segments.items()} for i, position in first.items()}
    batches, expired = _group_logged(logged, label_of, now - ttl, given)
    receipt["expired_ids"] += expired
    return batches


def _group_logged(
    logged: dict[str, LoggedPrediction], label_of: dict[str, int], oldest: datetime,
    given_segments: dict[str, dict[str, str]] | None = None,
) -> tuple[list[LabelledBatch], list[str]]:
    """Labelled logged predictions grouped by the version that served them; and the expired ids.

    A row's segment values are those logged with its prediction, overridden by
    any the label came with (``given_segments`` by id).
    """
    expired = []
    groups: dict[int, list[str]] = defaultdict(list)
    for prediction_id, prediction in logged.items():
        if prediction.created_at < oldest:
            expired.append(prediction_id)
        else:
            groups[prediction.version].append(prediction_id)
    batches = []
    for version, members in sorted(groups.items()):
        predictions = [logged[i] for i in members]
        accepted = [p.accepted for p in predictions]
        scores = [p.scores for p in predictions]
        features = [p.features for p in predictions]
        batches.append(
            LabelledBatch(
                version=version,
                probabilities=np.array([p.probabilities for p in predictions], dtype=np.float64),
                labels=np.array([label_of[i] for i in members], dtype=np.int64),
                prediction_ids=members,
                accepted=None if any(a is None for a in accepted) else np.array(accepted, dtype=bool),
                scores=None if any(score is None for score in scores) else scores,
                segments=_segment_columns(members, logged, given_segments),
                features=None if all(f is None for f in features) else features,
            )
        )
    return batches, expired


def _segment_columns(
    members: list[str], logged: dict[str, LoggedPrediction], given: dict[str, dict[str, str]] | None
) -> dict[str, np.ndarray] | None:
    per_row = [(logged[i].segments or {}) | ((given or {}).get(i) or {}) for i in members]
    dimensions = dict.fromkeys(k for row in per_row for k in row)
    if not dimensions:
        return None
    columns = {}
    for dimension in dimensions:
        column = np.empty(len(members), dtype=object)
        column[:] = [row.get(dimension) for row in per_row]
        columns[dimension] = column
    return columns


def _add_pending(
    session: Session, calibrator_id: int, ids: list[str], label_of: dict[str, int], now: datetime
) -> list[str]:
    """Store labels waiting for their prediction; returns the ids stored (the others already had one)."""
    statement = (
        _insert(session)(PendingLabelRow)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "prediction_id"])
        .returning(PendingLabelRow.prediction_id)
    )
    rows = [  # sorted by id, as feedback rows are: no deadlock between two requests
        {"calibrator_id": calibrator_id, "prediction_id": i, "label": label_of[i], "received_at": now} for i in sorted(ids)
    ]
    return list(session.scalars(statement, rows))


def _claim_pending(session: Session, calibrator_id: int, ids: list[str]) -> list[tuple[str, int]]:
    """Take (delete and return) the pending labels of these ids; a concurrent claim gets none of them."""
    claimed: list[tuple[str, int]] = []
    for start in range(0, len(ids), _ID_CHUNK):
        claimed += session.execute(
            delete(PendingLabelRow)
            .where(
                PendingLabelRow.calibrator_id == calibrator_id,
                PendingLabelRow.prediction_id.in_(ids[start : start + _ID_CHUNK]),
                PendingLabelRow.unmatched_at.is_(None),
            )
            .returning(PendingLabelRow.prediction_id, PendingLabelRow.label)
        ).all()
    return claimed


def any_pending(session: Session) -> bool:
    return session.scalar(select(PendingLabelRow.id).where(PendingLabelRow.unmatched_at.is_(None)).limit(1)) is not None


def join_pending(session: Session, join: PendingJoin, now: datetime) -> JoinCounts:
    """Join every pending label whose prediction is now in the log, in the session's transaction.

    The labels are deleted with RETURNING before they are recorded: of two
    processes joining at once, the second waits for the first's row locks
    (PostgreSQL) or its write lock (SQLite), then finds the rows gone. So
    every process can sweep, and no label is joined twice.
    """
    counts = JoinCounts()
    logged = select(PredictionRow.id).where(
        PredictionRow.calibrator_id == PendingLabelRow.calibrator_id,
        PredictionRow.prediction_id == PendingLabelRow.prediction_id,
    )
    claimed = session.execute(
        delete(PendingLabelRow)
        .where(PendingLabelRow.unmatched_at.is_(None), logged.exists())
        .returning(PendingLabelRow.calibrator_id, PendingLabelRow.prediction_id, PendingLabelRow.label)
    ).all()
    if not claimed:
        return counts
    by_calibrator: dict[int, dict[str, int]] = defaultdict(dict)
    for calibrator_id, prediction_id, label in claimed:
        by_calibrator[calibrator_id][prediction_id] = label
    names = _names(session, list(by_calibrator))
    for calibrator_id, label_of in by_calibrator.items():
        name = names.get(calibrator_id, str(calibrator_id))
        logged_predictions = find_predictions(session, calibrator_id, list(label_of))
        batches, expired = _group_logged(logged_predictions, label_of, now - join.prediction_ttl)
        counts.unmatched[name] += len(expired)
        for batch in batches:
            stored = _store_batch(session, calibrator_id, batch, now, join.drift)
            counts.joined[name] += stored.joined
            counts.duplicates[name] += len(stored.duplicate_ids)
    return counts


def sweep_pending(sessions: Sessions, join: PendingJoin, now: datetime | None = None) -> JoinCounts:
    """Join pending labels whose prediction has been written, then mark those past the grace period unmatched."""
    now = now or utcnow()
    with transaction(sessions) as session:
        if not any_pending(session):
            return JoinCounts()
        counts = join_pending(session, join, now)
        late = session.execute(
            update(PendingLabelRow)
            .where(PendingLabelRow.unmatched_at.is_(None), PendingLabelRow.received_at < now - join.grace)
            .values(unmatched_at=now)
            .returning(PendingLabelRow.calibrator_id)
        ).scalars().all()
        if late:
            names = _names(session, list(set(late)))
            for calibrator_id in late:
                counts.unmatched[names.get(calibrator_id, str(calibrator_id))] += 1
    return counts


def _names(session: Session, calibrator_ids: list[int]) -> dict[int, str]:
    return dict(session.execute(select(CalibratorRow.id, CalibratorRow.name).where(CalibratorRow.id.in_(calibrator_ids))).all())


def pending_labels(sessions: Sessions, name: str, limit: int) -> dict[str, Any]:
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


@dataclass
class _Stored:
    joined: int
    duplicate_ids: list[str]


def _store_batch(session: Session, calibrator_id: int, batch: LabelledBatch, now: datetime, drift: DriftSettings) -> _Stored:
    """Insert a batch's rows, then add those inserted (not duplicates of a labelled id) to the sums and the drift test."""
    # Feedback rows have no foreign key (one check per row): the calibrator is held once instead,
    # which deleting it waits for (repository.delete_calibrator).
    hold_calibrator(session, calibrator_id)
    if session.scalar(select(CalibratorRow.id).where(CalibratorRow.id == calibrator_id)) is None:
        raise NotFound(f"#{calibrator_id}")
    terms = feedback_terms(batch.probabilities, batch.labels, batch.accepted)
    duplicates: list[str] = []
    plain = batch.probabilities.ndim == 1 and batch.scores is None and batch.features is None
    if batch.prediction_ids is None and plain and session.get_bind().dialect.name == "postgresql":
        _copy_plain(session, calibrator_id, batch.version, now, terms.probability, batch.labels, batch.accepted)
    elif batch.prediction_ids is None:
        columns = _feedback_columns(batch, terms)
        _insert_feedback(session, calibrator_id, batch.version, now, columns, batch.features is not None)
    else:
        columns = _feedback_columns(batch, terms)
        inserted = set(_insert_feedback_once(session, calibrator_id, batch.version, now, columns))
        duplicates = [i for i in batch.prediction_ids if i not in inserted]
        if duplicates:
            batch = batch.subset(np.array([i in inserted for i in batch.prediction_ids], dtype=bool))
            terms = feedback_terms(batch.probabilities, batch.labels, batch.accepted)
    n = batch.labels.shape[0]
    if n:
        _add_to_buckets(session, calibrator_id, batch.version, minute(now), BinSums.of(terms))
        kept = np.ones(n, dtype=bool) if batch.accepted is None else batch.accepted
        if kept.any():
            _update_drift(session, calibrator_id, batch.version, terms.probability[kept], terms.outcome[kept], now, drift)
        if batch.segments:
            segment_store.store(
                session, calibrator_id, batch.version, minute(now), now, batch.segments, terms, batch.labels,
                batch.probabilities if batch.probabilities.ndim == 2 else None, drift.alpha, drift.tolerance,
                _insert(session),
            )
    return _Stored(n, duplicates)


def _feedback_columns(batch: LabelledBatch, terms: FeedbackTerms) -> list[tuple]:
    """(prediction id, probability, label, row, accepted, scores, features) per row, as stored."""
    n = batch.labels.shape[0]
    ids = batch.prediction_ids or [None] * n
    accepted = [None] * n if batch.accepted is None else batch.accepted.tolist()
    rows_probabilities = batch.probabilities.tolist() if batch.probabilities.ndim == 2 else [None] * n
    scores = batch.scores if batch.scores is not None else [None] * n
    features = batch.features if batch.features is not None else [None] * n
    return list(zip(ids, terms.probability.tolist(), batch.labels.tolist(), rows_probabilities, accepted, scores, features))


def _row_dicts(calibrator_id: int, version: int, now: datetime, columns) -> list[dict[str, Any]]:
    return [
        {
            "calibrator_id": calibrator_id,
            "version": version,
            "prediction_id": prediction_id,
            "probability": probability,
            "label": label,
            "probabilities": row,
            "accepted": accept,
            # null(): SQL NULL, which "IS NOT NULL" filters see (a bare None is stored as JSON null).
            "scores": null() if score is None else score,
            "features": null() if feature is None else feature,
            "received_at": now,
        }
        for prediction_id, probability, label, row, accept, score, feature in columns
    ]


def _insert_feedback(
    session: Session, calibrator_id: int, version: int, now: datetime, columns: list[tuple], features: bool = False
) -> None:
    """Rows without prediction ids: nothing to conflict with."""
    if session.get_bind().dialect.name == "postgresql":
        _copy_feedback(session, calibrator_id, version, now, columns, features)
    else:
        session.execute(_insert(session)(FeedbackRow), _row_dicts(calibrator_id, version, now, columns))


_FEEDBACK_UNNEST = text(
    f"INSERT INTO {FeedbackRow.__tablename__} "
    "(calibrator_id, version, prediction_id, probability, label, probabilities, accepted, scores, features, received_at) "
    "SELECT :calibrator_id, :version, * FROM unnest(CAST(:prediction_id AS text[]), CAST(:probability AS double precision[]), "
    "CAST(:label AS integer[]), CAST(:probabilities AS jsonb[]), CAST(:accepted AS boolean[]), CAST(:scores AS jsonb[]), "
    "CAST(:features AS jsonb[])), "
    "(SELECT CAST(:received_at AS timestamptz)) AS t "
    "ON CONFLICT (calibrator_id, prediction_id) DO NOTHING RETURNING prediction_id"
)


def _insert_feedback_once(session: Session, calibrator_id: int, version: int, now: datetime, columns: list[tuple]) -> list[str]:
    """Rows with prediction ids, each inserted unless its id is labelled already; returns the ids inserted.

    The rows go in sorted by id: two requests labelling overlapping ids then wait
    for each other's index entries in one order, and cannot deadlock (PostgreSQL).
    """
    columns = sorted(columns, key=lambda column: column[0])
    if session.get_bind().dialect.name == "postgresql":
        # One statement for the batch, as the prediction log's insert (executemany costs ~70 us a row).
        def json_texts(index: int) -> list[str | None]:
            return [None if c[index] is None else _json_dumps(c[index]).decode() for c in columns]

        return list(
            session.scalars(
                _FEEDBACK_UNNEST,
                {
                    "calibrator_id": calibrator_id,
                    "version": version,
                    "prediction_id": [c[0] for c in columns],
                    "probability": [c[1] for c in columns],
                    "label": [c[2] for c in columns],
                    "probabilities": json_texts(3),
                    "accepted": [c[4] for c in columns],
                    "scores": json_texts(5),
                    "features": json_texts(6),
                    "received_at": now,
                },
            )
        )
    statement = (
        _insert(session)(FeedbackRow)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "prediction_id"])
        .returning(FeedbackRow.prediction_id)
    )
    return list(session.scalars(statement, _row_dicts(calibrator_id, version, now, columns)))


_FEEDBACK_COPY = (
    f"COPY {FeedbackRow.__tablename__} (calibrator_id, version, prediction_id, probability, label, probabilities, "
    "accepted, scores, received_at{}) FROM STDIN (FORMAT BINARY)"
)
_FEEDBACK_TYPES = ["int4", "int4", "text", "float8", "int4", "jsonb", "bool", "jsonb", "timestamptz"]


def _json_dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def _copy_feedback(session: Session, calibrator_id: int, version: int, now: datetime, columns, features: bool = False) -> None:
    """Feedback rows by binary COPY, in the session's transaction: PostgreSQL's bulk path.

    executemany sends and checks one INSERT per row (about 70 us a row here,
    most of a 5,000-row request); COPY streams the rows as one command, and the
    binary format spares the server parsing every float and timestamp as text.
    The features column is copied only for a batch that has features (the plain
    path stays as it was).
    """
    from psycopg.types.json import Jsonb

    connection = session.connection().connection.driver_connection
    with connection.cursor() as cursor, cursor.copy(_FEEDBACK_COPY.format(", features" if features else "")) as copy:
        copy.set_types([*_FEEDBACK_TYPES, "jsonb"] if features else _FEEDBACK_TYPES)
        write = copy.write_row

        def json(value: Any) -> Jsonb | None:
            return None if value is None else Jsonb(value, dumps=_json_dumps)

        if features:
            for prediction_id, probability, label, row, accept, score, feature in columns:
                write((calibrator_id, version, prediction_id, probability, label, json(row), accept, json(score), now, json(feature)))
            return
        # The plain path keeps its own inlined loop: a per-row branch cost about 10% of it.
        for prediction_id, probability, label, row, accept, score, _ in columns:
            write((
                calibrator_id, version, prediction_id, probability, label,
                None if row is None else Jsonb(row, dumps=_json_dumps),
                accept,
                None if score is None else Jsonb(score, dumps=_json_dumps),
                now,
            ))


#: PostgreSQL's binary COPY: the signature before the rows, the trailer after, timestamps from 2000-01-01.
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\0" + bytes(8)
_COPY_TRAILER = b"\xff\xff"
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _copy_plain(
    session: Session, calibrator_id: int, version: int, now: datetime, probability: np.ndarray, label: np.ndarray,
    accepted: np.ndarray | None,
) -> None:
    """Binary rows with nothing but a probability, a label and maybe an acceptance (no ids, scores,
    features or probability rows): the COPY's bytes built by numpy in one block, the bytes
    ``_copy_feedback``'s ``write_row`` sends, without a Python call per row (most of its time).

    Each row: the field count, then each field's length (-1: NULL) and big-endian value.
    """
    field = [("calibrator_id", ">i4"), ("version", ">i4"), ("prediction_id", None), ("probability", ">f8"),
             ("label", ">i4"), ("probabilities", None), ("accepted", None if accepted is None else "u1"),
             ("scores", None), ("received_at", ">i8")]
    layout = [("fields", ">i2")]
    for name, kind in field:
        layout.append((f"{name}_length", ">i4"))
        if kind is not None:
            layout.append((name, kind))
    rows = np.empty(probability.shape[0], np.dtype(layout))
    rows["fields"] = len(field)
    for name, kind in field:
        rows[f"{name}_length"] = -1 if kind is None else np.dtype(kind).itemsize
    rows["calibrator_id"] = calibrator_id
    rows["version"] = version
    rows["probability"] = probability
    rows["label"] = label
    if accepted is not None:
        rows["accepted"] = accepted
    rows["received_at"] = (now - _PG_EPOCH) // timedelta(microseconds=1)
    connection = session.connection().connection.driver_connection
    with connection.cursor() as cursor, cursor.copy(_FEEDBACK_COPY.format("")) as copy:
        copy.write(_COPY_SIGNATURE + rows.tobytes() + _COPY_TRAILER)


def _add_to_buckets(session: Session, calibrator_id: int, version: int, bucket: datetime, sums: BinSums) -> None:
    rows = [{"calibrator_id": calibrator_id, "version": version, "bucket_start": bucket, **row} for row in sums.rows()]
    if not rows:
        return
    statement = _insert(session)(MonitorBucketRow)
    statement = statement.on_conflict_do_update(
        index_elements=["calibrator_id", "version", "bucket_start", "bin"],
        set_={name: getattr(MonitorBucketRow, name) + getattr(statement.excluded, name) for name in SUM_FIELDS},
    )
    session.execute(statement, rows)


def _update_drift(
    session: Session, calibrator_id: int, version: int, p: np.ndarray, y: np.ndarray, now: datetime, drift: DriftSettings
) -> None:
    # Create the row if missing, then lock it: concurrent feedback for one
    # version updates the test one batch at a time.
    session.execute(
        _insert(session)(DriftStateRow)
        .values(calibrator_id=calibrator_id, version=version, state={}, alarm=False, log_evalue=0.0, updated_at=now)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "version"])
    )
    row = session.scalars(
        select(DriftStateRow)
        .where(DriftStateRow.calibrator_id == calibrator_id, DriftStateRow.version == version)
        .with_for_update()
    ).one()
    test = DriftTest.from_dict(row.state) if row.state else DriftTest(alpha=drift.alpha, tolerance=drift.tolerance)
    result = test.update(p, y.astype(np.int8))
    row.state = test.to_dict()
    row.alarm = bool(result.alarm)
    row.log_evalue = float(result.log_evalue)
    row.updated_at = now


# -- monitor windows ----------------------------------------------------------------
def window_sums(sessions: Sessions, calibrator_id: int, version: int, now: datetime | None = None) -> dict[str, BinSums]:
    """Bin sums of every window of one version."""
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
                )
                .group_by(MonitorBucketRow.bin)
            ).all()
            sums[window] = BinSums.from_rows(rows)
        for window, limit in COUNT_WINDOWS.items():
            rows = session.execute(
                select(FeedbackRow.probability, FeedbackRow.label, FeedbackRow.probabilities, FeedbackRow.accepted)
                .where(FeedbackRow.calibrator_id == calibrator_id, FeedbackRow.version == version)
                .order_by(FeedbackRow.id.desc())
                .limit(limit)
            ).all()
            sums[window] = _sums_of_rows(rows)
    return sums


def _sums_of_rows(rows: list[tuple]) -> BinSums:
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


def drift_state(sessions: Sessions, calibrator_id: int, version: int) -> dict[str, Any]:
    """The drift test of one version: alarm, log e-value, and what it has seen."""
    with transaction(sessions) as session:
        row = session.get(DriftStateRow, (calibrator_id, version))
        state, updated_at = (row.state, row.updated_at) if row is not None else ({}, None)
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


def labelled_pairs(sessions: Sessions, calibrator_id: int, version: int | None = None, limit: int = 100_000) -> list[tuple]:
    """The newest labelled pairs (probability or rows, label), for reports and refits."""
    with transaction(sessions) as session:
        query = select(FeedbackRow.probability, FeedbackRow.probabilities, FeedbackRow.label, FeedbackRow.received_at).where(
            FeedbackRow.calibrator_id == calibrator_id
        )
        if version is not None:
            query = query.where(FeedbackRow.version == version)
        return list(session.execute(query.order_by(FeedbackRow.id.desc()).limit(limit)).all())


# -- retention -------------------------------------------------------------------------
def purge(sessions: Sessions, now: datetime, prediction_ttl: timedelta, feedback_retention: timedelta) -> dict[str, int]:
    """Delete expired predictions, and feedback, buckets, unmatched labels and idempotency keys past retention."""
    with transaction(sessions) as session:
        counts = {
            # Expired ids are still reported as expired for a day after their TTL.
            "predictions": session.execute(
                delete(PredictionRow).where(PredictionRow.created_at < now - prediction_ttl - timedelta(days=1))
            ).rowcount,
            "feedback": session.execute(delete(FeedbackRow).where(FeedbackRow.received_at < now - feedback_retention)).rowcount,
            "monitor_buckets": session.execute(
                delete(MonitorBucketRow).where(MonitorBucketRow.bucket_start < now - feedback_retention)
            ).rowcount,
            "idempotency_keys": session.execute(
                delete(IdempotencyRow).where(IdempotencyRow.created_at < now - timedelta(days=1))
            ).rowcount,
            # Joined labels leave the table; what stays is unmatched (or still in its grace period).
            "pending_labels": session.execute(
                delete(PendingLabelRow).where(PendingLabelRow.received_at < now - feedback_retention)
            ).rowcount,
            **segment_store.purge(session, now - feedback_retention),
        }
    return counts


def hourly_history(sessions: Sessions, calibrator_id: int, version: int, hours: int, now: datetime | None = None) -> list[tuple[datetime, BinSums]]:
    """Bin sums per hour of feedback received in the last ``hours`` hours, oldest first."""
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
