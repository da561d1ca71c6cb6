"""Label timing: each calibrator's label window, and the maturity step that feeds the monitors.

A prediction is mature when its calibrator's label window has passed since it
was served (or at once, when labels are final on arrival). ``mature`` runs in
the background of every serving process, in a process of its own
(``mature_database``), so that its Python never holds the GIL that requests
wait for: for each calibrator with a window it holds
the calibrator's maturity row, takes the next batch of predictions by
prediction time up to ``now - window``, and feeds the monitors, in
prediction-time order, each with its label, or as an implied negative
(``missing: negative``), or counts it as unlabelled (``missing: unlabelled``).
The cursor, the rows and the monitors change in one transaction: a crash
leaves either all of a batch done or none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy.orm import Session

from ..monitoring import label_delay
from ..storage import feedback as feedback_store
from ..storage import maturity as maturity_store
from ..storage.db import process_sessions, snapshot, transaction
from ..storage.feedback import LabelledBatch
from ..storage.models import utcnow
from ..storage.repository import Sessions, hold_calibrator
from . import monitoring
from .errors import InvalidRequest
from .feedback import segment_columns
from .monitoring import DriftSettings

if TYPE_CHECKING:
    from .container import Services


@dataclass(frozen=True)
class LabelWindow:
    """A calibrator's label settings as given: ``window`` ("7d", a number of seconds, or None) and ``missing``."""

    window_seconds: float | None = None
    missing: str = "negative"

    @classmethod
    def parse(cls, value: Any, at: str = "/labels") -> LabelWindow:
        """From ``{"window": "7d", "missing": "negative"}``; raises InvalidRequest naming the field."""
        try:
            return cls(*label_delay.parse_labels(value))
        except label_delay.LabelSettingsError as error:
            raise InvalidRequest(f"{at}/{error.field}" if error.field else at, error.detail) from None

    def as_dict(self) -> dict[str, Any]:
        return {"window": label_delay.format_window(self.window_seconds), "window_seconds": self.window_seconds,
                "missing": self.missing}


def describe(settings: maturity_store.LabelSettings) -> dict[str, Any]:
    """Label settings as the API shows them."""
    return LabelWindow(settings.window_seconds, settings.missing).as_dict()


def set_labels(services: Services, name: str, labels: LabelWindow) -> dict[str, Any]:
    """Change a calibrator's label settings (raises NotFound). A first window applies to the predictions
    served within the last window; removing one makes the waiting labels mature at the next step."""
    with transaction(services.sessions) as session:
        maturity_store.set_settings(session, name, labels.window_seconds, labels.missing, utcnow())
    return labels.as_dict()


def set_labels_in(session: Session, name: str, labels: LabelWindow) -> None:
    """The same in the caller's transaction (a fit that declares its label window)."""
    maturity_store.set_settings(session, name, labels.window_seconds, labels.missing, utcnow())


@dataclass
class Matured:
    """What one maturity pass did."""

    labelled: int = 0
    implied_negatives: int = 0
    unlabelled: int = 0


def has_work(sessions: Sessions) -> bool:
    """Whether any calibrator has a label window or waiting rows: a cheap check, so that a process
    whose calibrators have none never starts the maturity process. A read-only snapshot: on SQLite a
    write transaction would take the database's write lock every second for a read."""
    with snapshot(sessions) as session:
        return bool(maturity_store.to_mature(session))


def mature_database(url: str, drift: DriftSettings) -> Matured:
    """``mature`` on the database at ``url``: what the serving process asks of its maturity process
    (app/main.py), whose engine this process opens once."""
    return mature(process_sessions(url), drift)


def mature(sessions: Sessions, drift: DriftSettings, now: datetime | None = None, batch_rows: int = 5000,
           max_batches: int = 20, only: list[int] | None = None) -> Matured:
    """Feed the monitors every prediction matured by ``now``: in batches of about ``batch_rows``
    predictions, at most ``max_batches`` per calibrator a pass (the rest at the next pass).
    ``only``: these calibrator ids (default: every one with work)."""
    now = now or utcnow()
    total = Matured()
    with snapshot(sessions) as session:  # each batch below holds its calibrator in a transaction of its own
        candidates = maturity_store.to_mature(session)
    if only is not None:
        candidates = [c for c in candidates if c in only]
    for calibrator_id in candidates:
        for _ in range(max_batches):
            if _mature_batch(sessions, calibrator_id, drift, now, batch_rows, total):
                break
    return total


def _mature_batch(sessions: Sessions, calibrator_id: int, drift: DriftSettings, now: datetime, limit: int,
                  total: Matured) -> bool:
    """One batch of one calibrator; True once it is caught up."""
    with transaction(sessions) as session:
        hold_calibrator(session, calibrator_id)
        settings = maturity_store.settings_of(session, calibrator_id)
        if settings is None:
            return True
        if settings.window_seconds is None:  # the window was removed: what waited is mature now
            # No maturity row to claim here: the rows themselves are held, or two processes would feed them twice.
            rows = maturity_store.waiting_rows(session, calibrator_id, None, limit=limit, lock=True)
            _feed(session, calibrator_id, rows, [], settings, drift, now, total)
            return len(rows) < limit
        state = maturity_store.claim(session, calibrator_id)
        if state is None:
            return True
        target = now - timedelta(seconds=settings.window_seconds)
        if state.matured_through >= target:
            return True
        end = maturity_store.batch_end(session, calibrator_id, state.matured_through, target, limit)
        rows = maturity_store.waiting_rows(session, calibrator_id, end)
        unlabelled = maturity_store.unlabelled_predictions(session, calibrator_id, state.matured_through, end)
        _feed(session, calibrator_id, rows, unlabelled, settings, drift, now, total)
        state.matured_through = end
        state.updated_at = now
        return end >= target


def _feed(
    session: Session, calibrator_id: int, rows: list[tuple], unlabelled: list[tuple],
    settings: maturity_store.LabelSettings, drift: DriftSettings, now: datetime, total: Matured,
) -> None:
    """Feed waiting rows and the unlabelled predictions of the same span to the monitors, per version, in
    prediction-time order; store the implied negatives; mark the rows mature; count."""
    implied = [] if settings.missing != "negative" else [p for p in unlabelled if p[3] is None]  # binary only
    skipped = len(unlabelled) - len(implied)
    # (predicted_at, order, version, probability or row, label, accepted, segments)
    items = [(r[6], 0, r[1], r[4] if r[4] is not None else r[2], r[3], r[5], r[7]) for r in rows]
    items += [(p[8], 1, p[1], p[2], 0, p[4], p[6]) for p in implied]
    for version in sorted({item[2] for item in items}):
        chosen = sorted((item for item in items if item[2] == version), key=lambda item: (item[0], item[1]))
        probabilities = np.array([item[3] for item in chosen], dtype=np.float64)
        labels = np.array([item[4] for item in chosen], dtype=np.int64)
        flags = [item[5] for item in chosen]
        accepted = None if any(a is None for a in flags) else np.array(flags, dtype=bool)
        monitoring.update(
            session, calibrator_id, version, probabilities, labels, accepted, [item[0] for item in chosen],
            segment_columns([item[6] for item in chosen]), drift, now,
        )
    for version in sorted({p[1] for p in implied}):
        members = [p for p in implied if p[1] == version]
        scores = [p[5] for p in members]
        features = [p[7] for p in members]
        batch = LabelledBatch(
            version, np.array([p[2] for p in members], dtype=np.float64), np.zeros(len(members), dtype=np.int64),
            prediction_ids=[p[0] for p in members],
            accepted=None if any(p[4] is None for p in members) else np.array([p[4] for p in members], dtype=bool),
            scores=None if any(s is None for s in scores) else scores,
            features=None if all(f is None for f in features) else features,
            predicted_at=[p[8] for p in members],
        )
        feedback_store.insert(session, calibrator_id, batch, batch.probabilities, now)
    maturity_store.mark_mature(session, [r[0] for r in rows])
    maturity_store.count(session, calibrator_id, implied=len(implied), unlabelled=skipped)
    total.labelled += len(rows)
    total.implied_negatives += len(implied)
    total.unlabelled += skipped
