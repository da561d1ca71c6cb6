"""Database faults seen from outside, over HTTP: a database that accepts TCP but never answers,
one that is read-only, one that is full.

- Silent database: /readyz answers "not ready" within seconds (its own short timeout), and
  /metrics still answers 200 with the process's counters.
- Read-only PostgreSQL (every session ``default_transaction_read_only``, as on a standby): a write
  is a 503 that says the database is read-only, and /readyz says so too.
- Full SQLite (its page count capped on every connection): a write is a 507 that says the disk is
  full (not "retry shortly"), and /readyz reports it.
- ``calibd serve`` against a database that refuses connections, or never answers: one line on
  stderr and a non-zero exit, within the connect timeout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
from sqlalchemy import Engine, event

from calibd.config import Settings

from .conftest import LiveServer, free_port, migrated_database

HOLDOUT = {"scores": [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9] * 2, "labels": [0, 0, 1, 0, 1, 0, 1, 1] * 2}


class SilentServer:
    """A TCP port that accepts connections and never sends a byte."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.socket.close()
        for connection in self.held:
            connection.close()


def test_a_database_that_never_answers_gets_a_quick_not_ready_and_metrics_still_answer():
    silent = SilentServer()
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.port}/test"
        with LiveServer(Settings(database_url=url, json_logs=False)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
            started = time.perf_counter()
            ready = client.get("/readyz")
            seconds = time.perf_counter() - started
            assert ready.status_code == 503 and "unreachable" in ready.json()["detail"]
            assert seconds < 4, f"/readyz took {seconds:.1f} s"
            metrics = client.get("/metrics")
            assert metrics.status_code == 200
            assert "# TYPE calibd_prediction_log_dropped_total counter" in metrics.text
            # The second scrape does not wait for the failed read again.
            started = time.perf_counter()
            assert client.get("/metrics").status_code == 200
            assert time.perf_counter() - started < 1
    finally:
        silent.close()


def test_a_read_only_postgresql_answers_503_saying_so(database_url, name):
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's read-only sessions")
    with LiveServer(Settings(database_url=database_url, json_logs=False)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        assert client.post("/calibrators", json={"name": name, "method": "platt", "holdout": HOLDOUT}).status_code == 201
    read_only = database_url.replace("options=", "options=-cdefault_transaction_read_only%3Don%20")
    with LiveServer(Settings(database_url=read_only, json_logs=False)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        response = client.post("/feedback", json={"calibrator": name, "probabilities": [0.3], "labels": [1]})
        assert response.status_code == 503, response.text
        assert "read-only" in response.json()["detail"] and "Retry-After" not in response.headers
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "read-only" in ready.json()["detail"]


def test_a_snapshot_read_leaves_a_read_only_postgresql_read_only(database_url):
    """A snapshot sets its isolation and read-only mode for its own transaction: as connection options
    they came back from the pool as an explicit read-write, and the next write on that connection
    succeeded on a database made read-only."""
    import sqlalchemy.exc
    from sqlalchemy import text

    from calibd.storage.db import make_engine, make_sessionmaker, snapshot, transaction

    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's read-only sessions")
    engine = make_engine(database_url.replace("options=", "options=-cdefault_transaction_read_only%3Don%20"))
    sessions = make_sessionmaker(engine)
    try:
        with snapshot(sessions) as session:
            assert session.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"
        with pytest.raises(sqlalchemy.exc.DBAPIError, match="read-only transaction"):
            with transaction(sessions) as session:
                session.execute(text("CREATE TEMPORARY TABLE written (x int)"))
    finally:
        engine.dispose()


def test_a_full_sqlite_database_answers_507_saying_so(tmp_path, name):
    # A database of its own, vacuumed: the shared one has free pages from other tests' deletes, and
    # SQLite reuses free pages under any page cap, so a write there may still fit.
    with migrated_database("sqlite", tmp_path) as database_url:
        path = database_url.removeprefix("sqlite:///")

        def cap(dbapi_connection, _record) -> None:
            # Every page it has: no write that needs a new one fits (SQLITE_FULL).
            if dbapi_connection.execute("PRAGMA database_list").fetchone()[2] == path:
                pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
                dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

        with LiveServer(Settings(database_url=database_url, json_logs=False)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
            assert client.post("/calibrators", json={"name": name, "method": "platt", "holdout": HOLDOUT}).status_code == 201
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute("VACUUM")
        event.listen(Engine, "connect", cap)
        try:
            with LiveServer(Settings(database_url=database_url, json_logs=False)) as live, httpx.Client(base_url=live.url, timeout=30) as client:
                big = {"calibrator": name, "probabilities": [0.3] * 20_000, "labels": [1] * 20_000}
                response = client.post("/feedback", json=big)
                assert response.status_code == 507, response.text
                assert "full" in response.json()["detail"]
                ready = client.get("/readyz")
                assert ready.status_code == 503 and "full" in ready.json()["detail"]
        finally:
            event.remove(Engine, "connect", cap)


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_serve_against_an_unreachable_database_prints_one_line_and_exits_non_zero(tmp_path, kind):
    silent = SilentServer() if kind == "silent" else None
    port = silent.port if silent else free_port()  # nothing listens on a free port: connection refused
    env = os.environ | {"CALIBD_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{port}/test", "CALIBD_JSON_LOGS": "false"}
    try:
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "calibd.cli", "serve", "--port", str(free_port())], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=60,
        )
        seconds = time.perf_counter() - started
    finally:
        if silent:
            silent.close()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("calibd: cannot reach the database postgresql+psycopg://postgres@127.0.0.1:"), lines
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert seconds < 20, f"gave up after {seconds:.1f} s"  # the connect timeout, not the driver's default
