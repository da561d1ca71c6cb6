"""Feedback rows: labelled predictions as stored, by the fastest path each backend has.

One label per prediction id, the first received: the unique index on
feedback (calibrator_id, prediction_id) holds it on every backend and across
processes; rows with ids go in with ON CONFLICT DO NOTHING and the ids that
went in are returned. Rows without ids go in by binary COPY on PostgreSQL.
Each row keeps the time of its prediction (``predicted_at``) and whether it
waits for maturity (``waiting``, a calibrator with a label window).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from sqlalchemy import null, text
from sqlalchemy.orm import Session

from ..calibration.columns import Columns
from .models import FeedbackRow
from .sql import insert_for, is_postgresql, json_dumps


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
    #: When each prediction was served (None: at the label's receipt, as for self-contained rows without it).
    predicted_at: list[datetime] | None = None

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

    def segment_rows(self) -> list[dict[str, str] | None]:
        """Each row's segment values as {dimension: value} (None: none)."""
        n = self.labels.shape[0]
        if not self.segments:
            return [None] * n
        rows: list[dict[str, str] | None] = []
        for position in range(n):
            values = {k: v[position] for k, v in self.segments.items() if v[position] is not None}
            rows.append(values or None)
        return rows

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
            predicted_at=None if self.predicted_at is None else [self.predicted_at[i] for i in positions],
        )


def feature_rows(columns: Columns) -> list[dict[str, Any]]:
    """Validated feature columns as one {column: value} per row, as stored (a missing number is null)."""
    names = list(columns.columns)
    values = [
        column.tolist() if column.dtype == object else [None if v != v else v for v in column.tolist()]
        for column in columns.columns.values()
    ]
    return [dict(zip(names, row)) for row in zip(*values)]


def insert(
    session: Session, calibrator_id: int, batch: LabelledBatch, probability: np.ndarray, now: datetime, waiting: bool = False
) -> list[str] | None:
    """Store a batch's rows (``probability``: the stored probability of each row, binary p or the
    top-label confidence). With prediction ids: each row unless its id is labelled already, and the ids
    inserted are returned. ``waiting``: the rows wait for maturity."""
    plain = batch.probabilities.ndim == 1 and batch.scores is None and batch.features is None
    if batch.prediction_ids is None and plain and batch.predicted_at is None and not waiting and is_postgresql(session):
        _copy_plain(session, calibrator_id, batch.version, now, probability, batch.labels, batch.accepted)
        return None
    columns = _columns(batch, probability, now, waiting)
    if batch.prediction_ids is None:
        if is_postgresql(session):
            _copy_feedback(session, calibrator_id, batch.version, now, columns, batch.features is not None, waiting)
        else:
            session.execute(insert_for(session)(FeedbackRow), _row_dicts(calibrator_id, batch.version, now, columns, waiting))
        return None
    return _insert_once(session, calibrator_id, batch.version, now, columns, waiting)


def _columns(batch: LabelledBatch, probability: np.ndarray, now: datetime, waiting: bool) -> list[tuple]:
    """(prediction id, probability, label, row, accepted, scores, features, predicted_at, segments) per row,
    as stored; segments only for waiting rows (the others were monitored already)."""
    n = batch.labels.shape[0]
    ids = batch.prediction_ids or [None] * n
    accepted = [None] * n if batch.accepted is None else batch.accepted.tolist()
    rows_probabilities = batch.probabilities.tolist() if batch.probabilities.ndim == 2 else [None] * n
    scores = batch.scores if batch.scores is not None else [None] * n
    features = batch.features if batch.features is not None else [None] * n
    predicted_at = batch.predicted_at if batch.predicted_at is not None else [now] * n
    segments = batch.segment_rows() if waiting else [None] * n
    return list(zip(
        ids, probability.tolist(), batch.labels.tolist(), rows_probabilities, accepted, scores, features, predicted_at,
        segments,
    ))


def _row_dicts(calibrator_id: int, version: int, now: datetime, columns, waiting: bool) -> list[dict[str, Any]]:
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
            "predicted_at": predicted_at,
            "waiting": waiting,
            "segments": null() if segments is None else segments,
        }
        for prediction_id, probability, label, row, accept, score, feature, predicted_at, segments in columns
    ]


_FEEDBACK_UNNEST = text(
    f"INSERT INTO {FeedbackRow.__tablename__} "
    "(calibrator_id, version, prediction_id, probability, label, probabilities, accepted, scores, features, predicted_at, "
    "segments, received_at, waiting) "
    "SELECT :calibrator_id, :version, * FROM unnest(CAST(:prediction_id AS text[]), CAST(:probability AS double precision[]), "
    "CAST(:label AS integer[]), CAST(:probabilities AS jsonb[]), CAST(:accepted AS boolean[]), CAST(:scores AS jsonb[]), "
    "CAST(:features AS jsonb[]), CAST(:predicted_at AS timestamptz[]), CAST(:segments AS jsonb[])), "
    "(SELECT CAST(:received_at AS timestamptz), CAST(:waiting AS boolean)) AS t "
    "ON CONFLICT (calibrator_id, prediction_id) DO NOTHING RETURNING prediction_id"
)


def _insert_once(
    session: Session, calibrator_id: int, version: int, now: datetime, columns: list[tuple], waiting: bool
) -> list[str]:
    """Rows with prediction ids, each inserted unless its id is labelled already; returns the ids inserted.

    The rows go in sorted by id: two requests labelling overlapping ids then wait
    for each other's index entries in one order, and cannot deadlock (PostgreSQL).
    """
    columns = sorted(columns, key=lambda column: column[0])
    if is_postgresql(session):
        # One statement for the batch, as the prediction log's insert (executemany costs ~70 us a row).
        def json_texts(index: int) -> list[str | None]:
            return [None if c[index] is None else json_dumps(c[index]).decode() for c in columns]

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
                    "predicted_at": [c[7] for c in columns],
                    "segments": json_texts(8),
                    "received_at": now,
                    "waiting": waiting,
                },
            )
        )
    statement = (
        insert_for(session)(FeedbackRow)
        .on_conflict_do_nothing(index_elements=["calibrator_id", "prediction_id"])
        .returning(FeedbackRow.prediction_id)
    )
    return list(session.scalars(statement, _row_dicts(calibrator_id, version, now, columns, waiting)))


_FEEDBACK_COPY = (
    f"COPY {FeedbackRow.__tablename__} (calibrator_id, version, prediction_id, probability, label, probabilities, "
    "accepted, scores, received_at, predicted_at{}) FROM STDIN (FORMAT BINARY)"
)
_FEEDBACK_TYPES = ["int4", "int4", "text", "float8", "int4", "jsonb", "bool", "jsonb", "timestamptz", "timestamptz"]


def _copy_feedback(
    session: Session, calibrator_id: int, version: int, now: datetime, columns, features: bool, waiting: bool
) -> None:
    """Feedback rows by binary COPY, in the session's transaction: PostgreSQL's bulk path.

    executemany sends and checks one INSERT per row (about 70 us a row here,
    most of a 5,000-row request); COPY streams the rows as one command, and the
    binary format spares the server parsing every float and timestamp as text.
    The features and waiting columns are copied only for batches that have
    them (the plain path stays as it was).
    """
    from psycopg.types.json import Jsonb

    extra = (", features" if features else "") + (", waiting, segments" if waiting else "")
    types = [*_FEEDBACK_TYPES, *(["jsonb"] if features else []), *(["bool", "jsonb"] if waiting else [])]
    connection = session.connection().connection.driver_connection
    with connection.cursor() as cursor, cursor.copy(_FEEDBACK_COPY.format(extra)) as copy:
        copy.set_types(types)
        write = copy.write_row

        def json(value: Any) -> Jsonb | None:
            return None if value is None else Jsonb(value, dumps=json_dumps)

        if features or waiting:
            for prediction_id, probability, label, row, accept, score, feature, predicted_at, segments in columns:
                write((
                    calibrator_id, version, prediction_id, probability, label, json(row), accept, json(score), now,
                    predicted_at, *((json(feature),) if features else ()), *((True, json(segments)) if waiting else ()),
                ))
            return
        # The plain path keeps its own inlined loop: a per-row branch cost about 10% of it.
        for prediction_id, probability, label, row, accept, score, _, predicted_at, _ in columns:
            write((
                calibrator_id, version, prediction_id, probability, label,
                None if row is None else Jsonb(row, dumps=json_dumps),
                accept,
                None if score is None else Jsonb(score, dumps=json_dumps),
                now,
                predicted_at,
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
             ("scores", None), ("received_at", ">i8"), ("predicted_at", ">i8")]
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
    rows["received_at"] = rows["predicted_at"] = (now - _PG_EPOCH) // timedelta(microseconds=1)
    connection = session.connection().connection.driver_connection
    with connection.cursor() as cursor, cursor.copy(_FEEDBACK_COPY.format("")) as copy:
        copy.write(_COPY_SIGNATURE + rows.tobytes() + _COPY_TRAILER)


