"""A calibrator's stored predictor (transformer mode): the model server its /v2 infer requests
without ``scores`` are forwarded to.

Kept on the calibrator's row as JSON ({"url": ..., "model": ..., "output": ...}; null: none), so
that it goes with the calibrator: deleting the calibrator deletes it. A change bumps the registry
generation, so every process's ``CalibratorStore`` reloads its map of predictors on its next poll
(CALIBD_VERSION_POLL_SECONDS), as it does promotions.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import null, select
from sqlalchemy.orm import Session

from .db import transaction
from .models import CalibratorRow, utcnow
from .calibrator_rows import bump_generation, find_calibrator
from .sql import Sessions


def store(session: Session, calibrator_id: int, value: dict[str, Any] | None) -> None:
    """Set (or with None remove) a calibrator's predictor, in the caller's transaction."""
    row = session.get(CalibratorRow, calibrator_id)
    row.predictor = null() if value is None else value  # SQL NULL, not JSON null
    row.updated_at = utcnow()
    bump_generation(session)


def set_predictor(sessions: Sessions, name: str, value: dict[str, Any] | None) -> None:
    """Store the calibrator's predictor (None: remove it). Raises NotFound."""
    with transaction(sessions) as session:
        store(session, find_calibrator(session, name).id, value)


def get_predictor(sessions: Sessions, name: str) -> dict[str, Any] | None:
    """The calibrator's stored predictor, or None. Raises NotFound."""
    with transaction(sessions) as session:
        return find_calibrator(session, name).predictor


def all_predictors(sessions: Sessions) -> dict[str, dict[str, Any]]:
    """name -> stored predictor, for every calibrator that has one."""
    with transaction(sessions) as session:
        rows = session.execute(
            select(CalibratorRow.name, CalibratorRow.predictor).where(CalibratorRow.predictor.is_not(None))
        ).all()
    return {name: predictor for name, predictor in rows if predictor is not None}
