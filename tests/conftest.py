"""Fixtures: real databases (SQLite and PostgreSQL) and calibd served over real HTTP.

Every database test runs once per backend. PostgreSQL is
CALIBD_TEST_POSTGRES_URL (default: the local `test` database); each test
session works in a schema of its own, dropped at the end. Without CI set, an
unreachable PostgreSQL skips its half of the tests; with CI set, it fails them.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, text

from calibd.config import Settings
from calibd.main import create_app
from calibd.storage import migrate
from calibd.storage.db import make_engine

from .processes import free_port  # noqa: F401 (the tests import it from here)

POSTGRES_URL = os.environ.get("CALIBD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _postgres_schema_url(schema: str) -> str:
    separator = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def migrated_database(kind: str, folder: Path) -> Iterator[str]:
    """A new database of ``kind`` migrated to head; PostgreSQL ones are a schema of their own."""
    if kind == "sqlite":
        url = f"sqlite:///{folder / f'calibd-{uuid.uuid4().hex[:8]}.db'}"
        engine = make_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        yield url
        return
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        admin.dispose()
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI but unreachable at {POSTGRES_URL}: {error}")
        pytest.skip(f"PostgreSQL unreachable at {POSTGRES_URL}")
    schema = f"calibd_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    url = _postgres_schema_url(schema)
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(request, tmp_path_factory) -> Iterator[str]:
    """A migrated database of each backend, shared by the session's tests."""
    with migrated_database(request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def isolated_database_url(request, tmp_path_factory) -> Iterator[str]:
    """A database of each backend for one test module alone (e.g. one with API keys, which turn auth on)."""
    with migrated_database(request.param, tmp_path_factory.mktemp("isolated")) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_database(request, tmp_path) -> Iterator[str]:
    """A database of each backend for one test alone (a server that is killed or fuzzed writes to it)."""
    with migrated_database(request.param, tmp_path) as url:
        yield url


class LiveServer:
    """calibd served by uvicorn in a background thread, on a loopback port."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.port = free_port()
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("calibd did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="session")
def server(database_url) -> Iterator[LiveServer]:
    # Loopback predictors (tests/test_api_predictors.py) must be allowed: calibd allows none by default.
    with LiveServer(Settings(database_url=database_url, predictor_allow="127.0.0.1")) as live:
        yield live


@pytest.fixture
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


@pytest.fixture
def name() -> str:
    """A calibrator name no other test uses."""
    return f"test-{uuid.uuid4().hex[:16]}"


class RowCounter:
    """Counts the rows of every table, to prove a failed request wrote nothing."""

    TABLES = (
        "calibrators", "calibrator_versions", "registry_state", "predictions", "feedback", "pending_labels",
        "monitor_buckets", "drift_state", "idempotency_keys", "fit_jobs", "segment_declarations", "segment_values",
        "segment_monitor_buckets", "segment_feedback", "segment_drift_state",
    )

    def __init__(self, url: str):
        self.engine = make_engine(url)

    def __call__(self) -> dict[str, object]:
        with self.engine.connect() as connection:
            counts: dict[str, object] = {
                table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() for table in self.TABLES
            }
            counts["generation"] = connection.execute(text("SELECT generation FROM registry_state")).scalar_one()
        return counts


@pytest.fixture
def row_counts(database_url) -> Iterator[RowCounter]:
    counter = RowCounter(database_url)
    yield counter
    counter.engine.dispose()


REPO = Path(__file__).resolve().parent.parent


def stored_platt_version(sessions, name: str, **extra):
    """A Platt calibrator (near the identity, fitted on 40 rows) stored as version 1 of ``name`` straight
    through the repository, for tests that write below the API; ``extra``: more of ``create_version``'s
    arguments (``labels``, say). Returns its VersionInfo."""
    import numpy as np

    from calibd.calibration.platt import PlattCalibrator
    from calibd.storage import repository

    model = PlattCalibrator().fit(np.linspace(0.05, 0.95, 40), np.r_[np.zeros(20), np.ones(20)].astype(int))
    return repository.create_version(
        sessions, name=name, method="platt", input_kind="probability", n_classes=2, classes=None,
        parameters=model.to_dict(), summary={}, holdout_sha256="0" * 64, n_samples=40, fit_seconds=0.0, **extra,
    )


def fit_platt_over_http(http: httpx.Client, name: str) -> None:
    """Fit ``name`` with Platt through POST /calibrators, on 3,000 scores that overstate P(y = 1) = s^1.5."""
    import numpy as np

    rng = np.random.default_rng(1)
    scores = rng.uniform(0.01, 0.99, 3000)
    labels = (rng.uniform(size=3000) < scores**1.5).astype(int)
    answer = http.post("/calibrators", json={"name": name, "method": "platt",
                                             "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}})
    assert answer.status_code == 201, answer.text
