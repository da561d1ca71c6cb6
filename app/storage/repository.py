"""The named functions through which calibd reads and writes calibrators.

Each function is one transaction. They return plain dataclasses, never ORM
objects, so nothing outside this package touches a session.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from . import maturity, predictors
from . import segments as segments_rows
from .calibrator_rows import bump_generation, find_calibrator
from .db import transaction
from .models import CalibratorRow, FeedbackRow, RegistryState, VersionRow, utcnow
from .sql import NotFound, Sessions  # noqa: F401 (imported from here by the other modules)


class NoCurrentVersion(LookupError):
    """The calibrator exists but no version has been promoted."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"calibrator {name!r} has no current version; promote one or name a version")


class InvalidCursor(ValueError):
    """A pagination cursor this service did not issue."""


@dataclass(frozen=True)
class VersionHeader:
    """Which version this is and what it takes: all that serving it needs besides the calibrator."""

    name: str
    uid: str
    calibrator_id: int
    version: int
    method: str
    input_kind: str
    n_classes: int
    classes: list[Any] | None

    def header(self) -> dict[str, Any]:
        """These fields by name (a subclass's own fields left out)."""
        return {f.name: getattr(self, f.name) for f in fields(VersionHeader)}


@dataclass(frozen=True)
class VersionInfo(VersionHeader):
    parameters: dict[str, Any]
    summary: dict[str, Any]
    holdout_sha256: str
    n_samples: int
    fit_seconds: float
    created_at: datetime
    current_version: int | None

    @property
    def current(self) -> bool:
        return self.version == self.current_version


@dataclass(frozen=True)
class CalibratorInfo:
    name: str
    uid: str
    current_version: int | None
    latest_version: int
    created_at: datetime
    updated_at: datetime
    versions: list[VersionInfo] = field(default_factory=list)
    #: Label timing: the label window in seconds (None: labels are final on arrival), and what a missing label is.
    label_window_seconds: float | None = None
    label_missing: str = "negative"


def _version_info(calibrator: CalibratorRow, row: VersionRow) -> VersionInfo:
    return VersionInfo(
        name=calibrator.name,
        uid=calibrator.uid,
        calibrator_id=calibrator.id,
        version=row.version,
        method=row.method,
        input_kind=row.input_kind,
        n_classes=row.n_classes,
        classes=row.classes,
        parameters=row.parameters,
        summary=row.summary,
        holdout_sha256=row.holdout_sha256,
        n_samples=row.n_samples,
        fit_seconds=row.fit_seconds,
        created_at=row.created_at,
        current_version=calibrator.current_version,
    )


def _calibrator_info(row: CalibratorRow, versions: list[VersionRow] | None = None) -> CalibratorInfo:
    return CalibratorInfo(
        name=row.name,
        uid=row.uid,
        current_version=row.current_version,
        latest_version=row.latest_version,
        created_at=row.created_at,
        updated_at=row.updated_at,
        versions=[_version_info(row, v) for v in versions or []],
        label_window_seconds=row.label_window_seconds,
        label_missing=row.label_missing,
    )


def create_version(
    sessions: Sessions,
    *,
    name: str,
    method: str,
    input_kind: str,
    n_classes: int,
    classes: list[Any] | None,
    parameters: dict[str, Any],
    summary: dict[str, Any],
    holdout_sha256: str,
    n_samples: int,
    fit_seconds: float,
    promote: bool = True,
    segments: dict[str, Any] | None = None,
    predictor: dict[str, Any] | None = None,
    labels: tuple[float | None, str] | None = None,
) -> VersionInfo:
    """Store a fitted calibrator as version latest + 1 of ``name``, creating the name if new.

    The version number is taken by incrementing ``latest_version`` in the same
    transaction as the insert. The UPDATE locks the calibrator's row, so
    concurrent fits of one name queue there and get consecutive numbers; a
    failed insert rolls the counter back, leaving no gap. ``segments`` and
    ``predictor``, when given, become the calibrator's segment declaration and
    stored predictor in the same transaction; ``labels`` (window seconds, missing) its label settings.
    """
    now = utcnow()
    with transaction(sessions) as session:
        insert = postgresql_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        session.execute(
            insert(CalibratorRow)
            .values(name=name, uid=uuid.uuid4().hex, latest_version=0, created_at=now, updated_at=now)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        calibrator_id, version = session.execute(
            update(CalibratorRow)
            .where(CalibratorRow.name == name)
            .values(latest_version=CalibratorRow.latest_version + 1, updated_at=now)
            .returning(CalibratorRow.id, CalibratorRow.latest_version)
        ).one()
        row = VersionRow(
            calibrator_id=calibrator_id,
            version=version,
            method=method,
            input_kind=input_kind,
            n_classes=n_classes,
            classes=classes,
            parameters=parameters,
            summary=summary,
            holdout_sha256=holdout_sha256,
            n_samples=n_samples,
            fit_seconds=fit_seconds,
            created_at=now,
        )
        session.add(row)
        if segments is not None:
            segments_rows.declare(session, calibrator_id, segments, now)
        if predictor is not None:
            predictors.store(session, calibrator_id, predictor)
        if labels is not None:
            maturity.apply_settings(session, calibrator_id, *labels, now)
        if promote:
            session.execute(update(CalibratorRow).where(CalibratorRow.id == calibrator_id).values(current_version=version))
            bump_generation(session)
        session.flush()
        calibrator = session.get(CalibratorRow, calibrator_id)
        session.refresh(calibrator)
        return _version_info(calibrator, row)


def get_calibrator(sessions: Sessions, name: str) -> CalibratorInfo:
    """The calibrator and all its versions, oldest first."""
    with transaction(sessions) as session:
        row = find_calibrator(session, name)
        versions = session.scalars(
            select(VersionRow).where(VersionRow.calibrator_id == row.id).order_by(VersionRow.version)
        ).all()
        return _calibrator_info(row, list(versions))


def get_version(sessions: Sessions, name: str, version: int | None = None) -> VersionInfo:
    """One version; ``None`` means the current one."""
    with transaction(sessions) as session:
        calibrator = find_calibrator(session, name)
        if version is None:
            if calibrator.current_version is None:
                raise NoCurrentVersion(name)
            version = calibrator.current_version
        row = session.scalars(
            select(VersionRow).where(VersionRow.calibrator_id == calibrator.id, VersionRow.version == version)
        ).one_or_none()
        if row is None:
            raise NotFound(name, version)
        return _version_info(calibrator, row)


def list_calibrators(sessions: Sessions, limit: int, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """A page of calibrators ordered by name, each with its current version's method.

    ``cursor`` is opaque to clients: the last name of the previous page.
    """
    after = _decode_cursor(cursor) if cursor else None
    with transaction(sessions) as session:
        query = (
            select(CalibratorRow, VersionRow)
            .outerjoin(
                VersionRow,
                (VersionRow.calibrator_id == CalibratorRow.id)
                & (VersionRow.version == func.coalesce(CalibratorRow.current_version, CalibratorRow.latest_version)),
            )
            .order_by(CalibratorRow.name)
            .limit(limit + 1)
        )
        if after is not None:
            query = query.where(CalibratorRow.name > after)
        rows = session.execute(query).all()
    items = [
        {
            "name": calibrator.name,
            "current_version": calibrator.current_version,
            "latest_version": calibrator.latest_version,
            "method": version.method if version else None,
            "n_classes": version.n_classes if version else None,
            "created_at": calibrator.created_at,
            "updated_at": calibrator.updated_at,
        }
        for calibrator, version in rows[:limit]
    ]
    next_cursor = None
    if len(rows) > limit:
        next_cursor = base64.urlsafe_b64encode(items[-1]["name"].encode()).decode()
    return items, next_cursor


def _decode_cursor(cursor: str) -> str:
    try:
        name = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise InvalidCursor(cursor) from None
    if not name or "\x00" in name:  # no name holds NUL (PostgreSQL refuses it in a query)
        raise InvalidCursor(cursor)
    return name


def promote(sessions: Sessions, name: str, version: int) -> CalibratorInfo:
    """Make ``version`` the one served when a request names none."""
    with transaction(sessions) as session:
        calibrator = find_calibrator(session, name)
        exists = session.scalar(
            select(func.count()).where(VersionRow.calibrator_id == calibrator.id, VersionRow.version == version)
        )
        if not exists:
            raise NotFound(name, version)
        calibrator.current_version = version
        calibrator.updated_at = utcnow()
        bump_generation(session)
        session.flush()
        return _calibrator_info(calibrator)


#: The advisory lock class of calibrators (PostgreSQL), beside each calibrator's id.
_CALIBRATOR_LOCK = 0x63616C62  # "calb"


def hold_calibrator(session: Session, calibrator_id: int, exclusive: bool = False) -> None:
    """Until the transaction ends, keep the calibrator from being deleted (shared: feedback writers)
    or keep its writers out (exclusive: deleting it). An advisory lock rather than a row lock: its
    queue is fair, so a waiting delete holds back later writers, where row locks taken FOR KEY SHARE
    by a steady stream of writers could keep the delete waiting for ever. SQLite's write
    transactions exclude each other already."""
    if session.get_bind().dialect.name == "postgresql":
        function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        session.execute(text(f"SELECT {function}(:kind, :id)"), {"kind": _CALIBRATOR_LOCK, "id": calibrator_id})


def delete_calibrator(sessions: Sessions, name: str) -> None:
    """Delete the calibrator and, by cascade, all its versions; its feedback (no foreign key) explicitly."""
    with transaction(sessions) as session:
        calibrator = find_calibrator(session, name)
        # Held first: a feedback write under way commits before its rows are deleted here, and one
        # arriving later finds no calibrator.
        hold_calibrator(session, calibrator.id, exclusive=True)
        session.execute(delete(FeedbackRow).where(FeedbackRow.calibrator_id == calibrator.id))
        session.delete(calibrator)
        bump_generation(session)


def registry_generation(sessions: Sessions) -> int:
    with transaction(sessions) as session:
        return int(session.scalar(select(RegistryState.generation).where(RegistryState.id == 1)))


def current_versions(sessions: Sessions) -> dict[str, tuple[str, int | None]]:
    """name -> (uid, current version) for every calibrator."""
    with transaction(sessions) as session:
        rows = session.execute(select(CalibratorRow.name, CalibratorRow.uid, CalibratorRow.current_version)).all()
    return {name: (uid, current) for name, uid, current in rows}
