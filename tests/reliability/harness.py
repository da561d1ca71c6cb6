"""What the reliability tests and benchmarks share: calibd as a real process, databases, waiting.

- ``CalibdProcess``: ``calibd serve`` in a subprocess (logs to a file), which
  can be stopped, killed with SIGKILL and started again on the same port.
- ``PrivatePostgres``: a PostgreSQL cluster of its own (initdb in a temporary
  folder, its own port), for tests that stop the database. The shared cluster
  is never touched.
- ``postgres_database``: a fresh migrated schema on the shared cluster.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

from ..processes import free_port, stop, wait_ready

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "a condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def fit_body(name: str, seed: int = 0, n: int = 300, method: str = "platt", **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < scores).astype(int)
    return {"name": name, "method": method, "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}} | extra


def admin_key() -> str:
    """A fresh bootstrap admin key (calibd_<key id>_<secret>)."""
    return f"calibd_{os.urandom(4).hex()}_{os.urandom(24).hex()}"


def machine() -> str:
    """The machine the figures were measured on, for docs/RELIABILITY.md."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){memory}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


class CalibdProcess:
    """``calibd serve`` in a subprocess on a fixed loopback port; restartable after a kill."""

    def __init__(self, database_url: str, log_dir: Path, port: int | None = None, name: str = "calibd", **settings: Any):
        self.database_url = database_url
        self.port = port or free_port()
        self.log_path = Path(log_dir) / f"{name}-{self.port}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")}
        self.env |= {"CALIBD_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
        self.env |= {f"CALIBD_{key.upper()}": str(value) for key, value in settings.items()}
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 90) -> CalibdProcess:
        assert self.process is None or self.process.poll() is not None, "already running"
        log = open(self.log_path, "a")
        log.write(f"--- start {self.starts + 1} ---\n")
        log.flush()
        self.process = subprocess.Popen(
            [PYTHON, "-m", "calibd.cli", "serve", "--port", str(self.port)],
            cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        self.starts += 1
        wait_ready(self.process, self.url + "/healthz", timeout, "calibd", self.log_tail)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run, nothing is flushed."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        stop(self.process, timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        return records

    def __enter__(self) -> CalibdProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def metric_values(metrics_text: str, name: str, **labels: str) -> dict[str, float]:
    """Samples of one metric from a Prometheus exposition: {label string: value}, filtered by ``labels``."""
    values = {}
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        label_text = match.group(1) or ""
        if all(f'{key}="{value}"' in label_text for key, value in labels.items()):
            values[label_text] = float(match.group(2))
    return values


# -- databases ------------------------------------------------------------------------


def scalar(url: str, sql: str, **params: Any) -> Any:
    from calibd.storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text(sql), params).scalar_one()
    finally:
        engine.dispose()


def rows(url: str, sql: str, **params: Any) -> list[tuple]:
    from calibd.storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


@contextmanager
def postgres_database(folder: Path | None = None) -> Iterator[str]:
    """A fresh migrated schema on the shared PostgreSQL (dropped afterwards)."""
    from tests.conftest import migrated_database

    with migrated_database("postgresql", Path(folder or tempfile.gettempdir())) as url:
        yield url


def _postgres_bin(program: str) -> str:
    found = shutil.which(program)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{program}"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        raise FileNotFoundError(f"{program} (PostgreSQL server binaries) not found")
    return candidates[-1]


class PrivatePostgres:
    """A throwaway PostgreSQL cluster: initdb in a temporary folder, listening on its own port.

    As root, the server runs as the ``postgres`` user (PostgreSQL refuses root).
    Unix sockets live in the cluster's folder, so it shares nothing with the
    system cluster.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="calibd-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self.port = free_port()
        self.running = False
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.folder, "postgres", "postgres")

    @property
    def url(self) -> str:
        # connect_timeout: while the server is away, a connection attempt fails in seconds, not minutes.
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=3"

    def _run(self, program: str, *args: str, timeout: float = 120) -> None:
        command = [_postgres_bin(program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.folder)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def init(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions")
        return self

    def start(self) -> float:
        """Start the server and wait until it accepts connections; returns the seconds it took."""
        started = time.monotonic()
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.folder} -c max_connections=100"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "120", "start")
        self.running = True
        return time.monotonic() - started

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server. ``immediate`` is a crash as far as clients can tell (recovery on start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")
        self.running = False

    def cleanup(self) -> None:
        if self.running:
            try:
                self.stop("immediate")
            except Exception:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        try:
            self.init()
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
