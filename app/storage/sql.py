"""What every storage module shares: the session factory type, NotFound, the dialect's INSERT, JSON for
bulk statements, id chunks. It imports no other storage module."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

Sessions = sessionmaker[Session]


class NotFound(LookupError):
    """No calibrator of that name, or no such version of it."""

    def __init__(self, name: str, version: int | None = None):
        self.name = name
        self.version = version
        what = f"calibrator {name!r}" if version is None else f"version {version} of calibrator {name!r}"
        super().__init__(f"{what} does not exist")

#: Ids are looked up in chunks, within every backend's limit on bound parameters.
ID_CHUNK = 5000


def insert_for(session: Session):
    """The INSERT construct of the session's dialect (both have ON CONFLICT)."""
    return postgresql_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def json_dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
