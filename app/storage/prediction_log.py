"""The prediction log: predictions served with ids, written in batches behind /calibrate.

/calibrate only appends to an in-memory list; a background task writes the
list every ``interval`` seconds in one executemany. The log is best-effort
and not part of what /calibrate acknowledges: when the database is away, or
the list is full, predictions are dropped and counted by calibrator (their
labels then wait as pending labels until the grace period ends, and are
counted as unmatched). Labels that came before their prediction are joined
in the transaction that writes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from datetime import datetime

import numpy as np

from sqlalchemy.orm import Session

from .models import utcnow
from .predictions import log_predictions
from .repository import Sessions

logger = logging.getLogger("calibd")


@dataclass
class _Entry:
    calibrator_id: int
    name: str
    version: int
    ids: list[str]
    probabilities: np.ndarray
    accepted: np.ndarray | None
    scores: list | None
    created_at: datetime
    #: One {dimension: value} per prediction, or None.
    segments: list[dict[str, str]] | None = None
    #: Feature-taking methods: one {column: value} per prediction, or None.
    features: list[dict] | None = None


class PredictionLog:
    def __init__(
        self,
        sessions: Sessions,
        max_pending: int,
        on_drop: Callable[[str, int], None],
        join: Callable[[Session], Any] | None = None,
        on_join: Callable[[Any], None] | None = None,
    ):
        self._sessions = sessions
        self._max_pending = max_pending
        self._on_drop = on_drop
        self._join = join
        self._on_join = on_join
        self._entries: list[_Entry] = []
        self._pending = 0

    def add(
        self,
        calibrator_id: int,
        name: str,
        version: int,
        ids: list[str],
        probabilities: np.ndarray,
        accepted: np.ndarray | None = None,
        scores: list | None = None,
        segments: list[dict[str, str]] | None = None,
        features: list[dict] | None = None,
    ) -> None:
        """Queue predictions, and the raw scores (and features) they came from, for writing; O(1) on the request path."""
        if self._pending + len(ids) > self._max_pending:
            self._on_drop(name, len(ids))
            return
        self._entries.append(
            _Entry(calibrator_id, name, version, ids, probabilities, accepted, scores, utcnow(), segments, features)
        )
        self._pending += len(ids)

    def count_dropped(self, name: str, n: int) -> None:
        """Count ``n`` predictions of ``name`` dropped before they reached the log (its bound)."""
        self._on_drop(name, n)

    def take(self) -> list[_Entry]:
        entries, self._entries, self._pending = self._entries, [], 0
        return entries

    def write(self, entries: list[_Entry]) -> None:
        """Write taken entries (in a worker thread); on failure count them as dropped."""
        if not entries:
            return
        rows = []
        for entry in entries:
            multiclass = entry.probabilities.ndim == 2
            values = entry.probabilities.tolist()
            accepted = [None] * len(entry.ids) if entry.accepted is None else entry.accepted.tolist()
            scores = entry.scores if entry.scores is not None else [None] * len(entry.ids)
            segments = entry.segments if entry.segments is not None else [None] * len(entry.ids)
            features = entry.features if entry.features is not None else [None] * len(entry.ids)
            for prediction_id, value, accept, score, segment, feature in zip(
                entry.ids, values, accepted, scores, segments, features
            ):
                rows.append(
                    {
                        "calibrator_id": entry.calibrator_id,
                        "version": entry.version,
                        "prediction_id": prediction_id,
                        "probability": None if multiclass else value,
                        "probabilities": value if multiclass else None,
                        "accepted": accept,
                        "scores": score,
                        "segments": segment,
                        "features": feature,
                        "created_at": entry.created_at,
                    }
                )
        try:
            joined = log_predictions(self._sessions, rows, self._join)
        except Exception as error:  # the database may be away: the log is best-effort
            logger.warning("prediction log: dropped %d predictions: %s", len(rows), error)
            for entry in entries:
                self._on_drop(entry.name, len(entry.ids))
            return
        if joined and self._on_join is not None:
            self._on_join(joined)

    @property
    def pending(self) -> int:
        return self._pending
