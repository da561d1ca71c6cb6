"""A backlog of logged predictions maturing: its CPU, and /calibrate p99 meanwhile against idle (issue 27, item 6).

    .venv/bin/python benchmarks/maturity_backlog.py [--rows 1000000] [--rate 200] [--seconds 15] [--database-nice N]

A `calibd serve` process (one uvicorn worker, the maturity step every second)
on a fresh schema of the local PostgreSQL (CALIBD_BENCH_POSTGRES_URL). A
binary calibrator declares a label window of one hour (missing labels are
negatives). ``--rows`` predictions are written into its prediction log with
COPY (as /calibrate with ids would have logged them, half an hour ago, spread
over one minute): nothing is mature yet. /calibrate p99 is measured with an open-loop client
(benchmarks/_openloop.py: ``--rate`` requests a second of 10 scores each,
latency counted from when each request was due) in slices of ``--seconds``
that alternate: idle (the window one hour: nothing is mature) and maturing
(the window one second: the whole backlog is mature, and the maturity process
feeds it to the monitors in batches of 5,000, each an implied negative: a
feedback row, the window buckets, the drift test). Each maturing slice is
compared with the idle slice just before it, so that the machine's load moves
both alike. CPU: the calibd process tree (the maturity process is its child)
and its PostgreSQL backends (found by application_name), from /proc, over the
maturing slices, less their CPU in the idle ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    BENCH, Server, cpu_seconds, machine, median, postgres_available, postgres_schema, process_tree,
)

APPLICATION = "calibd_maturity_bench"


def conninfo(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def fill(url: str, calibrator_id: int, rows: int, start: datetime, span_seconds: float) -> float:
    """COPY ``rows`` logged predictions served from ``start`` over ``span_seconds``; seconds taken."""
    import psycopg

    rng = np.random.default_rng(0)
    step = timedelta(seconds=span_seconds / rows)
    statement = "COPY predictions (calibrator_id, version, prediction_id, probability, created_at) FROM STDIN (FORMAT BINARY)"
    started = time.perf_counter()
    with psycopg.connect(conninfo(url)) as connection:
        for first in range(0, rows, 500_000):
            n = min(500_000, rows - first)
            p = rng.beta(2, 5, n).tolist()
            with connection.transaction(), connection.cursor() as cursor, cursor.copy(statement) as copy:
                copy.set_types(["int4", "int4", "text", "float8", "timestamptz"])
                for i in range(n):
                    copy.write_row((calibrator_id, 1, f"m{first + i}", p[i], start + step * (first + i)))
        connection.execute("ANALYZE predictions")
    return time.perf_counter() - started


def scalar(url: str, query: str, *params):
    import psycopg

    with psycopg.connect(conninfo(url), autocommit=True) as connection:
        return connection.execute(query, params).fetchone()[0]


def backend_cpu(url: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving calibd (by application_name)."""
    import psycopg

    with psycopg.connect(conninfo(url), autocommit=True) as connection:
        pids = [r[0] for r in connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION,)).fetchall()]
    found = {}
    for pid in pids:
        try:
            found[pid] = cpu_seconds([pid])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def renice_database(url: str, nice: int, before: dict[int, int]) -> None:
    """Run every process of the PostgreSQL server (backends, WAL writer, checkpointer, autovacuum) at
    ``nice`` (root only): what /calibrate loses to the database's CPU on a machine it shares, told
    from what it loses to calibd's own work. ``before`` gets each process's niceness as it was."""
    import psycopg

    with psycopg.connect(conninfo(url), autocommit=True) as connection:
        pids = [r[0] for r in connection.execute("SELECT pid FROM pg_stat_activity").fetchall()]
    for pid in pids:
        try:
            before.setdefault(pid, os.getpriority(os.PRIO_PROCESS, pid))
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        except ProcessLookupError:
            pass


def restore_niceness(before: dict[int, int]) -> None:
    """The server's processes as they were: the database outlives the benchmark."""
    for pid, nice in before.items():
        try:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        except ProcessLookupError:
            pass


def open_loop(server: Server, body_file: str, rate: float, seconds: float) -> dict:
    out = subprocess.run(
        [sys.executable, str(BENCH / "_openloop.py"), server.url + "/calibrate", body_file, server.headers["Authorization"],
         str(rate), str(seconds), "16"], capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


class CpuMeter:
    """CPU seconds of the calibd process tree and its PostgreSQL backends since ``start``."""

    def __init__(self, server: Server, url: str):
        self.server, self.url = server, url

    def start(self) -> None:
        self.t = time.perf_counter()
        self.calibd = cpu_seconds(process_tree(self.server.process.pid))
        self.backends = backend_cpu(self.url)

    def stop(self) -> tuple[float, float, float]:
        """(seconds, calibd cores, backend cores)."""
        seconds = time.perf_counter() - self.t
        calibd = cpu_seconds(process_tree(self.server.process.pid)) - self.calibd
        now = backend_cpu(self.url)
        backends = sum(c - self.backends.get(pid, 0.0) for pid, c in now.items())
        return seconds, calibd / seconds, backends / seconds


def set_window(server: Server, window: str) -> None:
    import httpx

    answer = httpx.put(server.url + "/calibrators/mb/labels", json={"window": window, "missing": "negative"},
                       headers=server.headers, timeout=60)
    assert answer.status_code == 200, answer.text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200.0, help="/calibrate requests a second (open loop)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each p99 slice")
    parser.add_argument("--limit", type=float, default=900.0, help="give up on the maturation after this many seconds")
    parser.add_argument("--database-nice", type=int, metavar="N",
                        help="run the PostgreSQL server's processes at nice N, in idle and maturing slices alike (root)")
    args = parser.parse_args(argv)
    if not postgres_available():
        print("PostgreSQL unreachable: maturity_backlog not run", file=sys.stderr)
        return 1
    started_machine = machine()
    body_file = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    body_file.write(json.dumps({"calibrator": "mb", "scores": np.linspace(0.05, 0.95, 10).tolist()}).encode())
    body_file.close()
    rng = np.random.default_rng(1)
    reniced: dict[int, int] = {}
    with postgres_schema() as url, ExitStack() as restore:
        restore.callback(restore_niceness, reniced)
        served_url = f"{url}&application_name={APPLICATION}"
        env = {"CALIBD_LABEL_MATURITY_SECONDS": "1"}
        with Server(database_url=served_url, env=env) as server:
            s = rng.beta(2, 5, 20_000)
            server.post("/calibrators", {
                "name": "mb", "method": "platt", "labels": {"window": "1h", "missing": "negative"},
                "holdout": {"scores": s.tolist(), "labels": (rng.random(s.shape[0]) < s).astype(int).tolist()},
            })
            calibrator_id = scalar(url, "SELECT id FROM calibrators WHERE name = %s", "mb")
            origin = datetime.now(timezone.utc) - timedelta(minutes=30)
            fill_seconds = fill(url, calibrator_id, args.rows, origin, 60.0)
            print(f"filled {args.rows:,} predictions in {fill_seconds:.1f} s", file=sys.stderr, flush=True)
            open_loop(server, body_file.name, args.rate, 3)  # warm-up
            # Slices alternate: idle (the window 1 h: nothing is mature) and maturing (the window 1 s: the
            # whole backlog is mature), so that each busy slice has an idle one beside it on the same machine.
            meter = CpuMeter(server, url)
            idle, busy, idle_cpu, busy_cpu, progress = [], [], [], [], []
            done_at = None
            started = time.perf_counter()
            while time.perf_counter() - started < args.limit:
                for window, slices, cpu in (("1h", idle, idle_cpu), ("1s", busy, busy_cpu)):
                    set_window(server, window)
                    if args.database_nice is not None:  # the maturity process's connection opens at its start
                        renice_database(url, args.database_nice, reniced)
                    meter.start()
                    slices.append(open_loop(server, body_file.name, args.rate, args.seconds))
                    cpu.append(meter.stop())
                through = scalar(url, "SELECT matured_through FROM label_maturity WHERE calibrator_id = %s", calibrator_id)
                mature = scalar(url, "SELECT count(*) FROM predictions WHERE calibrator_id = %s AND created_at <= %s",
                                calibrator_id, through)
                progress.append((time.perf_counter() - started, mature))
                print(f"  {progress[-1][0]:.0f} s: {mature:,} mature, /calibrate p99 idle {idle[-1]['p99'] * 1e3:.1f} ms, "
                      f"maturing {busy[-1]['p99'] * 1e3:.1f} ms", file=sys.stderr, flush=True)
                if mature >= args.rows:
                    done_at = sum(c[0] for c in busy_cpu)
                    break
            mature = progress[-1][1]
    os.unlink(body_file.name)

    idle_p99 = [i["p99"] for i in idle]
    busy_p99 = [b["p99"] for b in busy]
    pair_ratios = [b / i for b, i in zip(busy_p99, idle_p99)]
    ratio = median(pair_ratios)
    idle_calibd = median([c[1] for c in idle_cpu])
    idle_backend = median([c[2] for c in idle_cpu])
    busy_seconds = sum(c[0] for c in busy_cpu)
    busy_calibd = sum(c[1] * c[0] for c in busy_cpu) / busy_seconds
    busy_backend = sum(c[2] * c[0] for c in busy_cpu) / busy_seconds
    maturity_cores = busy_calibd - idle_calibd + busy_backend - idle_backend
    seconds = done_at if done_at is not None else busy_seconds
    rate = mature / seconds
    lines = [
        "### A backlog maturing: CPU and /calibrate p99 (item 6)",
        "",
        f"`benchmarks/maturity_backlog.py --rows {args.rows} --rate {args.rate:g} --seconds {args.seconds:g}`; "
        f"{started_machine}. One uvicorn worker, PostgreSQL on the same machine, maturity step every second, "
        f"batches of 5,000; {args.rows:,} logged predictions without labels (each matures as an implied negative: "
        f"a feedback row, window buckets, drift test), all mature at once. /calibrate: open loop, {args.rate:g} "
        f"requests/s of 10 scores, p99 per {args.seconds:g}-s slice."
        + (f" The PostgreSQL server's processes at nice {args.database_nice}." if args.database_nice is not None else ""),
        "",
        "| | value |",
        "|---|---:|",
        f"| predictions written by COPY | {args.rows:,} in {fill_seconds:.1f} s |",
        f"| matured | {mature:,} in {seconds:.0f} s of maturing slices{'' if done_at is not None else ' (stopped at the limit)'}: "
        f"**{rate:,.0f} predictions/s** |",
        f"| 10,000,000 at that rate (extrapolated) | {10_000_000 / rate / 60:.0f} min |",
        f"| /calibrate p99 idle (median of slices; each) | **{median(idle_p99) * 1e3:.1f} ms** "
        f"({', '.join(f'{p * 1e3:.1f}' for p in idle_p99)}) |",
        f"| /calibrate p99 while maturing (median of slices; each) | **{median(busy_p99) * 1e3:.1f} ms** "
        f"({', '.join(f'{p * 1e3:.1f}' for p in busy_p99)}) |",
        f"| p99 while maturing over idle, slice by slice | **{ratio:.2f}x** (median; each "
        f"{', '.join(f'{r:.2f}' for r in pair_ratios)}); target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'} |",
        f"| CPU while maturing: calibd, its PostgreSQL backends (idle at the same rate) | {busy_calibd:.2f} + "
        f"{busy_backend:.2f} cores ({idle_calibd:.2f} + {idle_backend:.2f}) |",
        f"| **CPU of the maturity work** (maturing less idle) | **{maturity_cores:.2f} cores**; target <= 1: "
        f"{'met' if maturity_cores <= 1.0 else 'NOT met'} |",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
