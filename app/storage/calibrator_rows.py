"""The calibrator row lookups that several storage modules share: find a calibrator by name, and bump the
registry generation that tells every process to reload its map of versions and predictors."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .models import CalibratorRow, RegistryState
from .sql import NotFound


def bump_generation(session: Session) -> None:
    """Count a change that every process's calibrator store must reload, in the caller's transaction."""
    session.execute(update(RegistryState).where(RegistryState.id == 1).values(generation=RegistryState.generation + 1))


def find_calibrator(session: Session, name: str) -> CalibratorRow:
    """The calibrator row named ``name``. Raises NotFound."""
    row = session.scalars(select(CalibratorRow).where(CalibratorRow.name == name)).one_or_none()
    if row is None:
        raise NotFound(name)
    return row
