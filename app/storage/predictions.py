"""Predictions logged by /calibrate with ids: the rows, written in batches and found by id."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import String, any_, bindparam, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .db import transaction
from .models import PredictionRow
from .sql import ID_CHUNK, Sessions, insert_for, is_postgresql, json_dumps

logger = logging.getLogger("calibd")

T = TypeVar("T")


@dataclass
class LoggedPrediction:
    version: int
    probabilities: np.ndarray | float
    accepted: bool | None
    scores: Any
    created_at: datetime
    segments: dict[str, str] | None = None
    features: dict[str, Any] | None = None


def log_predictions(sessions: Sessions, rows: list[dict[str, Any]], then: Callable[[Session], T] | None = None) -> T | None:
    """Insert logged predictions in one batch; an id already logged keeps its first prediction.

    ``then`` runs in the same transaction, in a savepoint (the feedback service
    joins labels that arrived before their prediction): if it fails, a deadlock
    with a concurrent join say, the predictions are still written, and the next
    sweep does its work. Returns what ``then`` returned.
    """
    if not rows:
        return None
    with transaction(sessions) as session:
        if is_postgresql(session):
            _insert_predictions_unnest(session, rows)
        else:
            statement = insert_for(session)(PredictionRow).on_conflict_do_nothing(
                index_elements=["calibrator_id", "prediction_id"]
            )
            session.execute(statement, rows)
        if then is None:
            return None
        try:
            with session.begin_nested():
                return then(session)
        except DBAPIError as error:
            logger.warning("prediction log: pending labels left to the sweep: %s", error)
            return None


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
        return [None if row.get(key) is None else json_dumps(row[key]).decode() for row in rows]

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
    if is_postgresql(session):
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
                PredictionRow.calibrator_id == calibrator_id, PredictionRow.prediction_id.in_(unique[start : start + ID_CHUNK])
            )
            for start in range(0, len(unique), ID_CHUNK)
        ]
    for query in queries:
        rows = session.execute(query).all()
        for prediction_id, version, probability, probabilities, accepted, scores, created_at, segments, features in rows:
            value = probability if probabilities is None else np.asarray(probabilities, dtype=np.float64)
            found[prediction_id] = LoggedPrediction(version, value, accepted, scores, created_at, segments, features)
    return found
