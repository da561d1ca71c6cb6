"""Engines and transactions for SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    """An engine with the settings calibd relies on for each backend."""
    # orjson: stored parameters can hold large arrays.
    json = {"json_serializer": _dumps, "json_deserializer": _loads}
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **json)
        _configure_sqlite(engine)
        return engine
    # pre_ping replaces connections that died while the database restarted.
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, **json)


def _dumps(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _loads(value):
    # SQLite's numeric affinity hands back a bare JSON number as a number.
    if isinstance(value, (int, float)):
        return value
    return orjson.loads(value)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection) -> None:
        # Take the write lock at the start: a deferred transaction that later
        # writes can fail with "database is locked" instead of waiting its turn.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits together at the end, or not at all."""
    with sessions() as session, session.begin():
        yield session
