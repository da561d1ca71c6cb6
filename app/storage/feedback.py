"""Feedback, logged predictions and monitor state: the functions that read and write them.

A feedback request commits in one transaction: its labelled rows, the monitor
sums of their minute and bins, the drift test's new state, and the
idempotency record. Either all of it is stored, or none.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import orjson
from sqlalchemy import String, any_, bindparam, delete, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..monitoring.drift import DriftTest
from ..monitoring.windows import COUNT_WINDOWS, SUM_FIELDS, TIME_WINDOWS, BinSums, feedback_terms
from .db import transaction
from .models import DriftStateRow, FeedbackRow, IdempotencyRow, MonitorBucketRow, PredictionRow, utcnow
from .repository import Sessions

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


@dataclass
class LoggedPrediction:
    version: int
    probabilities: np.ndarray | float
    accepted: bool | None
    scores: Any
    created_at: datetime


# -- predictions logged by /calibrate -------------------------------------------
def log_predictions(sessions: Sessions, rows: list[dict[str, Any]]) -> None:
    """Insert logged predictions in one batch; an id already logged keeps its first prediction."""
    if not rows:
        return
    with transaction(sessions) as session:
        if session.get_bind().dialect.name == "postgresql":
            _insert_predictions_unnest(session, rows)
            return
        statement = _insert(session)(PredictionRow).on_conflict_do_nothing(
            index_elements=["calibrator_id", "prediction_id"]
        )
        session.execute(statement, rows)


_PREDICTIONS_UNNEST = text(
    f"INSERT INTO {PredictionRow.__tablename__} "
    "(calibrator_id, version, prediction_id, probability, probabilities, accepted, scores, created_at) "
    "SELECT * FROM unnest(CAST(:calibrator_id AS integer[]), CAST(:version AS integer[]), CAST(:prediction_id AS text[]), "
    "CAST(:probability AS double precision[]), CAST(:probabilities AS jsonb[]), CAST(:accepted AS boolean[]), "
    "CAST(:scores AS jsonb[]), CAST(:created_at AS timestamptz[])) "
    "ON CONFLICT (calibrator_id, prediction_id) DO NOTHING"
)


def _insert_predictions_unnest(session: Session, rows: list[dict[str, Any]]) -> None:
    """All rows in one INSERT ... SELECT FROM unnest(one array per column) (PostgreSQL).

    The same rows and conflict rule as the executemany it replaces, which sends
    one INSERT per row (about 70 us each here): the prediction log of a busy
    /calibrate writes tens of thousands of rows a second.
    """

    def json_texts(key: str) -> list[str | None]:
        return [None if row[key] is None else _json_dumps(row[key]).decode() for row in rows]

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
        for prediction_id, version, probability, probabilities, accepted, scores, created_at in rows:
            value = probability if probabilities is None else np.asarray(probabilities, dtype=np.float64)
            found[prediction_id] = LoggedPrediction(version, value, accepted, scores, created_at)
    return found


# -- feedback ----------------------------------------------------------------------
def stored_response(sessions: Sessions, key: str) -> dict[str, Any] | None:
    """The answer already given to a request with this Idempotency-Key, if any."""
    with transaction(sessions) as session:
        return session.scalar(select(IdempotencyRow.response).where(IdempotencyRow.key == key))


class IdempotencyConflict(Exception):
    """Another request with the same Idempotency-Key committed first."""


def record_feedback(
    sessions: Sessions,
    *,
    calibrator_id: int,
    batches: list[LabelledBatch] | None = None,
    ids: list[str] | None = None,
    labels: np.ndarray | None = None,
    prediction_ttl: timedelta,
    drift: DriftSettings,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Record labelled predictions, given directly (``batches``) or by logged id (``ids``, ``labels``).

    Returns the receipt: how many were recorded, and which ids were unknown or
    had expired. With an ``idempotency_key`` the receipt is stored in the same
    transaction; a concurrent request with the same key raises IdempotencyConflict
    (its receipt is then ``stored_response(key)``).
    """
    now = now or utcnow()
    try:
        with transaction(sessions) as session:
            unknown: list[str] = []
            expired: list[str] = []
            if ids is not None:
                batches, unknown, expired = _join_logged(session, calibrator_id, ids, labels, now - prediction_ttl)
            count = 0
            for batch in batches or []:
                count += _store_batch(session, calibrator_id, batch, now, drift)
            receipt = {"count": count, "unknown_ids": unknown, "expired_ids": expired}
            if idempotency_key is not None:
                session.add(IdempotencyRow(key=idempotency_key, calibrator_id=calibrator_id, response=receipt, created_at=now))
                session.flush()
            return receipt
    except IntegrityError:
        if idempotency_key is not None and stored_response(sessions, idempotency_key) is not None:
            raise IdempotencyConflict(idempotency_key) from None
        raise


def _join_logged(
    session: Session, calibrator_id: int, ids: list[str], labels: np.ndarray, oldest: datetime
) -> tuple[list[LabelledBatch], list[str], list[str]]:
    """Group labels for logged ids by the version that served them."""
    logged = find_predictions(session, calibrator_id, ids)
    unknown, expired = [], []
    groups: dict[int, list[int]] = defaultdict(list)
    for position, prediction_id in enumerate(ids):
        prediction = logged.get(prediction_id)
        if prediction is None:
            unknown.append(prediction_id)
        elif prediction.created_at < oldest:
            expired.append(prediction_id)
        else:
            groups[prediction.version].append(position)
    batches = []
    for version, positions in sorted(groups.items()):
        predictions = [logged[ids[i]] for i in positions]
        accepted = [p.accepted for p in predictions]
        scores = [p.scores for p in predictions]
        batches.append(
            LabelledBatch(
                version=version,
                probabilities=np.array([p.probabilities for p in predictions], dtype=np.float64),
                labels=labels[positions],
                prediction_ids=[ids[i] for i in positions],
                accepted=None if any(a is None for a in accepted) else np.array(accepted, dtype=bool),
                scores=None if any(score is None for score in scores) else scores,
            )
        )
    return batches, unknown, expired


def _store_batch(session: Session, calibrator_id: int, batch: LabelledBatch, now: datetime, drift: DriftSettings) -> int:
    terms = feedback_terms(batch.probabilities, batch.labels, batch.accepted)
    n = batch.labels.shape[0]
    multiclass = batch.probabilities.ndim == 2
    ids = batch.prediction_ids or [None] * n
    accepted = [None] * n if batch.accepted is None else batch.accepted.tolist()
    rows_probabilities = batch.probabilities.tolist() if multiclass else [None] * n
    scores = batch.scores if batch.scores is not None else [None] * n
    columns = zip(ids, terms.probability.tolist(), batch.labels.tolist(), rows_probabilities, accepted, scores)
    if session.get_bind().dialect.name == "postgresql":
        _copy_feedback(session, calibrator_id, batch.version, now, columns)
    else:
        session.execute(
            _insert(session)(FeedbackRow),
            [
                {
                    "calibrator_id": calibrator_id,
                    "version": batch.version,
                    "prediction_id": prediction_id,
                    "probability": probability,
                    "label": label,
                    "probabilities": row,
                    "accepted": accept,
                    "scores": score,
                    "received_at": now,
                }
                for prediction_id, probability, label, row, accept, score in columns
            ],
        )
    _add_to_buckets(session, calibrator_id, batch.version, minute(now), BinSums.of(terms))
    kept = np.ones(n, dtype=bool) if batch.accepted is None else batch.accepted
    if kept.any():
        _update_drift(session, calibrator_id, batch.version, terms.probability[kept], terms.outcome[kept], now, drift)
    return n


_FEEDBACK_COPY = (
    f"COPY {FeedbackRow.__tablename__} (calibrator_id, version, prediction_id, probability, label, probabilities, "
    "accepted, scores, received_at) FROM STDIN (FORMAT BINARY)"
)
_FEEDBACK_TYPES = ["int4", "int4", "text", "float8", "int4", "jsonb", "bool", "jsonb", "timestamptz"]


def _json_dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def _copy_feedback(session: Session, calibrator_id: int, version: int, now: datetime, columns) -> None:
    """Feedback rows by binary COPY, in the session's transaction: PostgreSQL's bulk path.

    executemany sends and checks one INSERT per row (about 70 us a row here,
    most of a 5,000-row request); COPY streams the rows as one command, and the
    binary format spares the server parsing every float and timestamp as text.
    """
    from psycopg.types.json import Jsonb

    connection = session.connection().connection.driver_connection
    with connection.cursor() as cursor, cursor.copy(_FEEDBACK_COPY) as copy:
        copy.set_types(_FEEDBACK_TYPES)
        write = copy.write_row
        for prediction_id, probability, label, row, accept, score in columns:
            write((
                calibrator_id, version, prediction_id, probability, label,
                None if row is None else Jsonb(row, dumps=_json_dumps),
                accept,
                None if score is None else Jsonb(score, dumps=_json_dumps),
                now,
            ))


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
    """Delete expired predictions, and feedback, buckets and idempotency keys past retention."""
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
