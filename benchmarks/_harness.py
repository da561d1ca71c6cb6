"""Shared pieces of the service benchmarks: a `calibd serve` process, wrk, results files.

Every service benchmark starts its own `calibd serve` (a real uvicorn process,
as deployed), drives it from a separate process (wrk, or an async client),
and writes two files under benchmarks/results/: ``<name>.md`` (its section of
RESULTS.md) and ``<name>.json`` (its rows of the targets table). Then
``report.assemble()`` rebuilds RESULTS.md from every file there, so running
one benchmark never erases another's section.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
if str(ROOT) not in sys.path:  # tests/processes.py, tests/mlserver_env.py
    sys.path.insert(0, str(ROOT))

from tests.processes import free_port, stop, wait_ready  # noqa: E402
RESULTS = BENCH / "results"
BIN = Path(sys.executable).parent
CALIBD = str(BIN / "calibd")
POSTGRES_URL = os.environ.get("CALIBD_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


# -- numbers ---------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return float(statistics.median(values))


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {load[0]:.1f} at start"
    )


# -- results files -------------------------------------------------------------------------
@dataclass
class Target:
    """One row of the targets table."""

    key: str  # sorts the table: "1a", "1b", ... "6"
    target: str  # what is measured, in words
    figure: str  # the measured figure, formatted
    baseline: str  # what it is compared with, formatted
    ratio: float | None  # figure / baseline (or as the requirement states it)
    requirement: str  # e.g. ">= 0.9x"
    met: bool
    note: str = ""


def write_results(name: str, section: str, targets: list[Target], assemble: bool = True) -> None:
    """Write this benchmark's section and targets, then rebuild RESULTS.md."""
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (RESULTS / f"{name}.md").write_text(section.rstrip() + "\n")
    payload = {"benchmark": name, "measured_at": stamp, "targets": [vars(t) for t in targets]}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    if assemble:
        sys.path.insert(0, str(BENCH))
        import report

        report.assemble()


# -- a calibd serve process -------------------------------------------------------------------
@contextmanager
def postgres_schema(calibd: str = CALIBD) -> Iterator[str]:
    """A fresh schema in the local PostgreSQL, migrated to head by ``calibd`` (an executable); its URL.
    Dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    schema = f"calibd_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    separator = "&" if "?" in POSTGRES_URL else "?"
    url = f"{POSTGRES_URL}{separator}options=-csearch_path%3D{schema}"
    try:
        subprocess.run([calibd, "migrate"], env={**os.environ, "CALIBD_DATABASE_URL": url}, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def postgres_available() -> bool:
    try:
        from sqlalchemy import create_engine, text

        engine = create_engine(POSTGRES_URL)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@contextmanager
def pinned_database(cpus: set[int] | None) -> Iterator[None]:
    """The local PostgreSQL server's processes (the postmaster, so every backend it forks later too) on
    ``cpus`` while the block runs, as a database on a host of its own would leave the server's cores alone;
    their CPU sets as they were afterwards, on SIGTERM too: the database outlives the benchmark. Refused
    unless the server is a postgres process tree of this machine that this user may pin (root or postgres).
    None: nothing changes. It pins the whole server: other users of it share those CPUs meanwhile."""
    if cpus is None:
        yield
        return
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_URL)
    with engine.connect() as connection:  # while the backend lives
        backend = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        try:
            postmaster = int(Path(f"/proc/{backend}/stat").read_text().rpartition(")")[2].split()[1])
            names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in (backend, postmaster)}
        except FileNotFoundError:
            names = set()
    engine.dispose()
    if names != {"postgres"}:
        raise RuntimeError(f"{POSTGRES_URL} is not a PostgreSQL server running on this machine: not pinned")
    before = {postmaster: os.sched_getaffinity(postmaster)}
    try:
        os.sched_setaffinity(postmaster, before[postmaster])  # a no-op that fails early without the right
    except PermissionError as error:
        raise RuntimeError("pinning PostgreSQL needs root or the postgres user") from error

    def pin(pids: list[int], cpu_sets: dict[int, set[int]]) -> None:
        for pid in pids:
            try:
                cpu_sets.setdefault(pid, os.sched_getaffinity(pid))
                os.sched_setaffinity(pid, cpus)
            except ProcessLookupError:
                pass

    def terminated(signum, frame):  # a timeout's SIGTERM still restores the CPU sets
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        pin([postmaster], before)  # first: what it forks from now on is pinned
        pin(process_tree(postmaster)[1:], before)
        yield
    finally:
        os.sched_setaffinity(postmaster, before[postmaster])  # first: what it forks from now on is not
        for pid in process_tree(postmaster)[1:]:
            try:  # a backend forked meanwhile has no entry: the postmaster's set
                os.sched_setaffinity(pid, before.get(pid, before[postmaster]))
            except ProcessLookupError:
                pass
        signal.signal(signal.SIGTERM, previous)


def pinned(command: list[str], cpus: str | None, prefix: tuple[str, ...] = ()) -> list[str]:
    """``command`` run by ``taskset -c cpus`` (a list such as "0-3"); itself when ``cpus`` is None.
    Every process and thread it starts inherits the set. ``prefix``: a tool that runs the command
    (valgrind and its options), between taskset and the command."""
    command = [*prefix, *command]
    return command if cpus is None else ["taskset", "-c", cpus, *command]


class Server:
    """``calibd serve`` in a child process of its own, with the benchmark routes on and auth on
    (``cpus``: the CPUs it and its workers may use, a taskset list; ``calibd``: the executable, by
    default this checkout's, or another checkout's to compare two codes; ``prefix``: a tool that runs
    it, such as valgrind; ``ready_timeout``: how long it may take to answer /readyz)."""

    def __init__(self, database_url: str | None = None, workers: int = 1, env: dict[str, str] | None = None,
                 log: str = "pipe", key: str | None = None, cpus: str | None = None, calibd: str = CALIBD,
                 prefix: tuple[str, ...] = (), ready_timeout: float = 180):
        self.cpus = cpus
        self.calibd = calibd
        self.prefix = prefix
        self.ready_timeout = ready_timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="calibd-bench-"))
        self.database_url = database_url or f"sqlite:///{self.tmp / 'calibd.db'}"
        self.workers = workers
        self.port = free_port()
        # Its own key id, unless given one (servers that one wrk header must open).
        self.key = key or f"calibd_bench{secrets.token_hex(4)}_{secrets.token_hex(16)}"
        self.env = {
            **os.environ,
            "CALIBD_DATABASE_URL": self.database_url,
            "CALIBD_BENCHMARK_ROUTES": "1",
            "CALIBD_BOOTSTRAP_ADMIN_KEY": self.key,
            **(env or {}),
        }
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.process: subprocess.Popen | None = None
        self.log_path = self.tmp / "server.log"
        #: Where the server's log lines go: "pipe" (read by a thread of this process, as a container's
        #: log collector reads them; the last lines are kept for errors) or "file" (server.log).
        self.log = log
        self._tail: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def __enter__(self) -> Server:
        self._log = open(self.log_path, "wb") if self.log == "file" else subprocess.PIPE
        self.process = subprocess.Popen(
            pinned([self.calibd, "serve", "--port", str(self.port), "--workers", str(self.workers)], self.cpus, self.prefix),
            env=self.env, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.tmp,
        )
        if self.log != "file":
            import threading

            threading.Thread(target=self._drain, daemon=True).start()
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _drain(self) -> None:
        """Read the server's log lines as a log collector would, keeping the last few."""
        for line in self.process.stdout:
            self._tail.append(line.decode(errors="replace"))
            if len(self._tail) > 200:
                del self._tail[:100]

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log == "file" else "".join(self._tail)

    def _wait_ready(self) -> None:
        wait_ready(self.process, self.url + "/readyz", self.ready_timeout, "calibd serve", self.log_text)  # busy: minutes
        if self.workers > 1:  # every worker must be up before the load starts
            time.sleep(2.0)

    def __exit__(self, *exc) -> None:
        stop(self.process)
        if self.log == "file":
            self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- what a benchmark does with it ----------------------------------------------------------
    def post(self, path: str, body: Any, timeout: float = 600) -> Any:
        import httpx
        import orjson

        response = httpx.post(
            self.url + path, content=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            headers={**self.headers, "Content-Type": "application/json"}, timeout=timeout,
        )
        if response.status_code >= 300:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    def fit(self, name: str, method: str, scores, labels, **extra) -> dict:
        return self.post("/calibrators", {"name": name, "method": method,
                                          "holdout": {"scores": scores, "labels": labels}, **extra})

    def serving_pids(self) -> list[int]:
        """The processes that serve requests: the uvicorn process, or its worker children."""
        assert self.process is not None
        if self.workers == 1:
            return [self.process.pid]
        children = _children(self.process.pid)
        # uvicorn's workers are the children that themselves run the fit pool (they have children).
        return [pid for pid in children if _children(pid)] or children


class EchoServer:
    """The bare echo app (benchmarks/echo_app.py) in a process of its own, served as ``calibd serve``
    serves calibd: uvicorn, the same flags, the same worker count. ``url`` is its POST route.
    ``raw``: the plain ASGI echo (no FastAPI) instead of the FastAPI one; ``prefix`` and
    ``ready_timeout`` as for ``Server``."""

    def __init__(self, workers: int = 1, raw: bool = False, cpus: str | None = None,
                 prefix: tuple[str, ...] = (), ready_timeout: float = 60):
        self.workers = workers
        self.raw = raw
        self.cpus = cpus
        self.prefix = prefix
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/echo"

    def __enter__(self) -> EchoServer:
        command = [sys.executable, str(BENCH / "echo_app.py"), "--port", str(self.port), "--workers", str(self.workers)]
        self.process = subprocess.Popen(
            pinned(command + (["--raw"] if self.raw else []), self.cpus, self.prefix),
            cwd=BENCH, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_ready(self.process, f"http://127.0.0.1:{self.port}/readyz", self.ready_timeout, "the echo server")
        if self.workers > 1:
            time.sleep(2.0)
        return self

    def __exit__(self, *exc) -> None:
        stop(self.process)

    def serving_pids(self) -> list[int]:
        assert self.process is not None
        return [self.process.pid] if self.workers == 1 else _children(self.process.pid)


def _children(pid: int) -> list[int]:
    """The child processes of every thread of ``pid`` (a side process is started from a worker thread)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:  # the thread or process ended meanwhile
            pass
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (uvicorn's workers, their fit workers)."""
    found, todo = [pid], [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def settle(pid: int, idle_share: float = 0.05, timeout: float = 60.0) -> float:
    """Wait until the process tree of ``pid`` is idle (below ``idle_share`` of a core over half a
    second): a server is ready before its fit workers have imported their modules, and that
    start-up work would otherwise be measured as serving. Returns the seconds waited."""
    started = time.monotonic()
    last = cpu_seconds(process_tree(pid))
    while time.monotonic() - started < timeout:
        time.sleep(0.5)
        now = cpu_seconds(process_tree(pid))
        if now - last < idle_share * 0.5:
            break
        last = now
    return time.monotonic() - started


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes have used (from /proc/<pid>/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def split_cpus(pids: list[int]) -> set[int] | None:
    """Pin every thread of ``pids`` to the first CPU this process may use; the others, returned,
    are for the load generator (None, and nothing pinned, with fewer than two CPUs).

    A server and its load generator sharing cores moves a run's figures by the kernel's
    placement of the two from one second to the next; apart, runs agree far more closely.
    """
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), {available[0]})  # threads started later inherit it
    return set(available[1:])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


# -- wrk ----------------------------------------------------------------------------------------
WRK_SCRIPT = r"""
local path = os.getenv("WRK_BODY_FILE")
local f = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = os.getenv("WRK_AUTHORIZATION")
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
"""


@dataclass
class WrkResult:
    requests: int
    seconds: float
    errors: int
    non2xx: int
    p50: float  # seconds
    p90: float
    p99: float
    server_cpu: float = float("nan")  # server CPU seconds per request, when measured


    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


WRK_MISSING = "wrk is not installed: apt-get install -y wrk (Debian, Ubuntu), brew install wrk (macOS)"


def run_wrk(url: str, body: bytes, authorization: str, seconds: float, connections: int = 8, threads: int = 1,
            server_pids: list[int] | None = None, cpus: set[int] | None = None) -> WrkResult:
    """wrk posting ``body`` over keep-alive connections; fails on errors or non-2xx answers.

    With ``server_pids``, also the CPU time those processes spent per request;
    with ``cpus``, wrk runs on those CPUs only.
    """
    if not wrk_available():
        raise RuntimeError(WRK_MISSING)
    cpu_before = cpu_seconds(server_pids) if server_pids else 0.0
    folder = Path(tempfile.mkdtemp(prefix="wrk-"))
    try:
        (folder / "post.lua").write_text(WRK_SCRIPT)
        (folder / "body.json").write_bytes(body)
        env = {**os.environ, "WRK_BODY_FILE": str(folder / "body.json"), "WRK_AUTHORIZATION": authorization}
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s",
             "-s", str(folder / "post.lua"), url],
            env=env, capture_output=True, text=True, check=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        ).stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    line = next(l for l in out.splitlines() if l.startswith("WRKJSON "))
    data = json.loads(line[len("WRKJSON "):])
    result = WrkResult(data["requests"], data["duration_us"] / 1e6, data["errors"], data["non2xx"],
                       data["p50_us"] / 1e6, data["p90_us"] / 1e6, data["p99_us"] / 1e6)
    if server_pids and result.requests:
        result.server_cpu = (cpu_seconds(server_pids) - cpu_before) / result.requests
    if result.non2xx or result.errors:
        raise RuntimeError(f"wrk saw {result.non2xx} non-2xx answers and {result.errors} socket errors on {url}")
    return result


# -- an open-loop load generator (wrk2-style: latency from the scheduled send time) --------------
def open_loop(url: str, body: bytes, authorization: str, rate: float, seconds: float, connections: int = 32,
              trace: str | None = None) -> dict:
    """Run benchmarks/_openloop.py in its own process; its latencies, in seconds.

    With ``trace``, every request's (due time, latency) is written there too.
    """
    folder = Path(tempfile.mkdtemp(prefix="openloop-"))
    try:
        (folder / "body.json").write_bytes(body)
        out = subprocess.run(
            [sys.executable, str(BENCH / "_openloop.py"), url, str(folder / "body.json"), authorization,
             str(rate), str(seconds), str(connections), *([trace] if trace else [])],
            capture_output=True, text=True, check=True,
        ).stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])
