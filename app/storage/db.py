"""Engines and transactions for SQLite and PostgreSQL."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

#: Seconds to open a PostgreSQL connection, and to wait for a pooled one: a database that
#: accepts TCP but never answers fails requests in seconds instead of holding them.
CONNECT_TIMEOUT_SECONDS = 5
POOL_TIMEOUT_SECONDS = 10


def make_engine(url: str) -> Engine:
    """An engine with the settings calibd relies on for each backend."""
    # orjson: stored parameters can hold large arrays.
    json = {"json_serializer": _dumps, "json_deserializer": _loads}
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **json)
        _configure_sqlite(engine)
        return engine
    # pre_ping replaces connections that died while the database restarted.
    return create_engine(
        url, pool_pre_ping=True, pool_size=10, max_overflow=10, pool_timeout=POOL_TIMEOUT_SECONDS,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS}, **json,
    )


def make_side_engine(url: str, timeout: float, connections: int = 1) -> Engine:
    """A small engine of its own for reads that must answer within ``timeout`` seconds whatever the
    routes do: readiness and the /metrics monitor read. It never takes a connection from the main
    pool; every connect, pool wait and statement gives up after ``timeout``."""
    json = {"json_serializer": _dumps, "json_deserializer": _loads}
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": timeout},
            pool_size=connections, max_overflow=0, pool_timeout=timeout, **json,
        )
        _configure_sqlite(engine, busy_ms=int(timeout * 1000))
        return engine
    engine = create_engine(
        url, pool_pre_ping=True, pool_size=connections, max_overflow=0, pool_timeout=timeout,
        connect_args={"connect_timeout": max(1, math.ceil(timeout))}, **json,
    )

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # A per-session SET keeps the URL's own options (a search_path, say).
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {int(timeout * 1000)}")
        dbapi_connection.commit()

    return engine


def _dumps(value) -> str:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _loads(value):
    # SQLite's numeric affinity hands back a bare JSON number as a number.
    if isinstance(value, (int, float)):
        return value
    return orjson.loads(value)


def _configure_sqlite(engine: Engine, busy_ms: int = 30000) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection) -> None:
        # Take the write lock at the start: a deferred transaction that later
        # writes can fail with "database is locked" instead of waiting its turn.
        # A snapshot read needs no lock: in WAL mode its first read fixes what it sees.
        read_only = connection.get_execution_options().get(_READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


#: In a side process: the sessions of each database it works on (by URL and timeout).
_process_sessions: dict[tuple[str, float | None], sessionmaker[Session]] = {}


def process_sessions(url: str, timeout: float | None = None) -> sessionmaker[Session]:
    """Sessions on ``url`` for the functions a side process runs, on an engine this process opens at
    the first call and keeps: ``make_side_engine(url, timeout)`` when a timeout is given, else
    ``make_engine(url)``."""
    key = (url, timeout)
    if key not in _process_sessions:
        engine = make_engine(url) if timeout is None else make_side_engine(url, timeout)
        _process_sessions[key] = make_sessionmaker(engine)
    return _process_sessions[key]


_READ_ONLY = "calibd_read_only"


@contextmanager
def snapshot(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A read-only session whose queries all see one snapshot of the database: REPEATABLE READ
    on PostgreSQL, one deferred read transaction on SQLite (WAL). Rows that several queries read
    together (a segment's window sums and its drift test) then always agree."""
    engine = sessions.kw["bind"]
    with engine.connect() as connection:
        postgresql = connection.dialect.name == "postgresql"
        if not postgresql:
            connection.execution_options(**{_READ_ONLY: True})
        with connection.begin(), Session(bind=connection, expire_on_commit=False) as session:
            if postgresql:
                # For this transaction only. As connection options (isolation_level, postgresql_readonly)
                # they are reset when the connection returns to the pool, to an explicit read-write that
                # makes every later transaction on it BEGIN READ WRITE, past a database an operator made
                # read-only (default_transaction_read_only): its writes would then succeed.
                connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield session


@contextmanager
def transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits together at the end, or not at all."""
    with sessions() as session, session.begin():
        yield session


def storage_fault(error: BaseException) -> str | None:
    """``"full"`` or ``"read-only"`` when a database error says the database cannot take writes
    (a retry will not help until an operator acts), else None."""
    original = getattr(error, "orig", None) or error
    code = getattr(original, "sqlstate", None)
    message = str(original).lower()
    if code == "53100" or "database or disk is full" in message or "no space left" in message:
        return "full"
    if code == "25006" or "readonly database" in message or "read-only transaction" in message:
        return "read-only"
    return None
