"""calibd across uvicorn workers, each server and wrk pinned to disjoint cores (targets 32.3a-b).

    .venv/bin/python benchmarks/workers.py [--runs 5] [--seconds 3] [--wrk-cores K] [--workers 1,2,4,8]

The CPUs this process may use are split: the first ``n - K`` serve, the last
K run wrk (``-tK``; K is half of them, rounded up, unless given). Each worker
count N of 1, 2, 4, ... up to the serving CPUs is measured for three servers,
each started with ``taskset`` on the first N serving CPUs (its workers, and
calibd's fit workers, inherit the set):

  * ``calibd serve --workers N`` (auth on with one key, JSON access log on,
    written to a file; request metrics on: with N > 1, prometheus-client's
    multiprocess mode), POST /calibrate with the 100-score isotonic body;
  * the raw ASGI echo (benchmarks/echo_app.py --raw) with N workers;
  * the FastAPI echo (benchmarks/echo_app.py) with N workers.

The echoes get an Authorization header of the same length, unread. wrk
posts over ``--connections-per-worker`` x N keep-alive connections. The
three servers of one N are up together and measured in turn, the order
rotating from run to run; figures are medians over runs, each ratio the
median of the per-run ratios. Server CPU per request counts every process of
the server. This process runs on wrk's cores too.

On a 2-core machine that is one worker against wrk on the other core. On 16
cores it is 1, 2, 4 and 8 workers on cores 0-7 against wrk -t8 on cores 8-15,
where the targets apply: calibd at 8 workers >= 7x calibd at 1, and >= 0.75x
the raw echo at 8 workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    EchoServer, Server, Target, fmt_rate, machine, median, process_tree, run_wrk, settle, wrk_available,
    WRK_MISSING, write_results,
)
import calibrate_throughput as ct  # noqa: E402

KINDS = ("calibd", "raw", "echo")
NAMES = {"calibd": "calibd /calibrate", "raw": "raw ASGI echo", "echo": "FastAPI echo"}
#: Targets on a machine with at least this many serving cores: (workers, scaling over 1 worker, ratio to raw echo).
SCALE_WORKERS, SCALE_NEED, RAW_NEED = 8, 7.0, 0.75


def cpu_plan(available: list[int], wrk_cores: int | None) -> tuple[list[int], list[int]]:
    """(serving CPUs, wrk's CPUs): wrk gets the last ``wrk_cores`` (half, rounded up, by default)."""
    if len(available) < 2:
        raise SystemExit("workers.py needs at least 2 CPUs: one to serve, one for wrk")
    k = wrk_cores or (len(available) + 1) // 2
    k = min(max(k, 1), len(available) - 1)
    return available[:-k], available[-k:]


def worker_counts(serving: int, asked: str | None) -> list[int]:
    if asked:
        return [n for n in (int(x) for x in asked.split(",")) if 1 <= n <= serving]
    counts, n = [], 1
    while n <= serving:
        counts.append(n)
        n *= 2
    return counts


def cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--wrk-cores", type=int, default=None, help="CPUs for wrk (default: half, rounded up)")
    parser.add_argument("--workers", default=None, help="worker counts, e.g. 1,2,4,8 (default: powers of 2 that fit)")
    parser.add_argument("--connections-per-worker", type=int, default=16)
    args = parser.parse_args(argv)
    if not wrk_available():
        print(WRK_MISSING, file=sys.stderr)
        return 2

    serving, loading = cpu_plan(sorted(os.sched_getaffinity(0)), args.wrk_cores)
    os.sched_setaffinity(0, set(loading))  # this process (and the log drains) stays off the serving cores
    counts = worker_counts(len(serving), args.workers)
    body = ct.bodies(np.random.default_rng(0))["1b"]
    started_machine = machine()
    folder = Path(tempfile.mkdtemp(prefix="calibd-workers-"))
    url = f"sqlite:///{folder / 'calibd.db'}"
    with Server(database_url=url) as server:
        ct.fit_calibrators(server, np.random.default_rng(1))
    rates = {(kind, n): [] for kind in KINDS for n in counts}
    cpu = {(kind, n): [] for kind in KINDS for n in counts}
    ratios = {(other, n): [] for other in ("raw", "echo") for n in counts}
    wrk_cpus = set(loading)
    threads = len(loading)
    try:
        for n in counts:
            cores = cpu_list(serving[:n])
            connections = max(threads, args.connections_per_worker * n)
            calibd = Server(database_url=url, workers=n, cpus=cores, log="file")
            with calibd, EchoServer(n, raw=True, cpus=cores) as raw, EchoServer(n, cpus=cores) as echo:
                auth = calibd.headers["Authorization"]
                targets = {
                    "calibd": (calibd.url + "/calibrate", auth, calibd.process.pid),
                    "raw": (raw.url, "Bearer " + "0" * (len(auth) - 7), raw.process.pid),
                    "echo": (echo.url, "Bearer " + "0" * (len(auth) - 7), echo.process.pid),
                }
                for kind, (target, header, pid) in targets.items():
                    settle(pid)
                    run_wrk(target, body, header, 2.0, connections, threads=threads, cpus=wrk_cpus)  # every worker warm
                for run in range(args.runs):
                    order = list(KINDS[run % 3:] + KINDS[:run % 3])
                    got = {}
                    for kind in order:
                        target, header, pid = targets[kind]
                        result = run_wrk(target, body, header, args.seconds, connections, threads=threads,
                                         server_pids=process_tree(pid), cpus=wrk_cpus)
                        got[kind] = result
                        rates[kind, n].append(result.rate)
                        cpu[kind, n].append(result.server_cpu)
                    for other in ("raw", "echo"):
                        ratios[other, n].append(got["calibd"].rate / got[other].rate)
                    print(f"  {n} worker(s), run {run + 1}: " + ", ".join(f"{k} {got[k].rate:,.0f}/s" for k in KINDS)
                          + f"; calibd / raw {ratios['raw', n][-1]:.3f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    one = {kind: median(rates[kind, counts[0]]) for kind in KINDS}
    lines = [
        "## calibd across uvicorn workers, servers and wrk on disjoint cores (targets 32.3a-b)",
        "",
        f"`benchmarks/workers.py --runs {args.runs} --seconds {args.seconds:g}`; {started_machine}. "
        f"Servers pinned (taskset) to CPUs {cpu_list(serving)} (N workers: the first N), wrk -t{threads} "
        f"-c{args.connections_per_worker}xN pinned to CPUs {cpu_list(loading)}. 100-score isotonic /calibrate "
        "(`calibd serve --workers N`: auth on with one key, JSON access log on (to a file), request metrics on, "
        "prometheus-client's multiprocess mode at N > 1) against the raw ASGI echo (benchmarks/echo_app.py --raw) "
        "and the FastAPI echo (benchmarks/echo_app.py), same uvicorn flags and worker count, same body; the three "
        "interleaved, order rotating per run. Medians over runs; ratios are medians of per-run ratios.",
        "",
        "| workers | raw ASGI echo req/s | FastAPI echo req/s | calibd req/s | **calibd / raw echo** | calibd / FastAPI echo "
        "| calibd at N / at 1 | raw echo at N / at 1 | server CPU per request: raw / FastAPI / calibd |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in counts:
        m = {kind: median(rates[kind, n]) for kind in KINDS}
        lines.append(
            f"| {n} | {fmt_rate(m['raw'])} | {fmt_rate(m['echo'])} | {fmt_rate(m['calibd'])} "
            f"| **{median(ratios['raw', n]):.3f}** ({', '.join(f'{r:.2f}' for r in ratios['raw', n])}) "
            f"| {median(ratios['echo', n]):.3f} | {m['calibd'] / one['calibd']:.2f} | {m['raw'] / one['raw']:.2f} "
            f"| {median(cpu['raw', n]) * 1e6:.0f} / {median(cpu['echo', n]) * 1e6:.0f} / {median(cpu['calibd', n]) * 1e6:.0f} us |"
        )
    targets = []
    if SCALE_WORKERS in counts:
        scaling = median(rates["calibd", SCALE_WORKERS]) / one["calibd"]
        raw_ratio = median(ratios["raw", SCALE_WORKERS])
        targets += [
            Target("32.3a", f"calibd at {SCALE_WORKERS} uvicorn workers over 1, cores to itself, 100-score /calibrate",
                   f"{fmt_rate(median(rates['calibd', SCALE_WORKERS]))} req/s", f"{fmt_rate(one['calibd'])} req/s (1 worker)",
                   scaling, f">= {SCALE_NEED:g}x", scaling >= SCALE_NEED),
            Target("32.3b", f"calibd over the raw ASGI echo at {SCALE_WORKERS} workers, 100-score /calibrate",
                   f"{fmt_rate(median(rates['calibd', SCALE_WORKERS]))} req/s",
                   f"{fmt_rate(median(rates['raw', SCALE_WORKERS]))} req/s (raw echo)", raw_ratio, f">= {RAW_NEED}x",
                   raw_ratio >= RAW_NEED),
        ]
        lines += ["", f"At {SCALE_WORKERS} workers: calibd {scaling:.2f}x its 1-worker rate (target >= {SCALE_NEED:g}x: "
                      f"{'met' if scaling >= SCALE_NEED else 'NOT met'}), {raw_ratio:.3f}x the raw echo (target >= "
                      f"{RAW_NEED}x: {'met' if raw_ratio >= RAW_NEED else 'NOT met'})."]
    else:
        lines += ["", f"The scaling targets (32.3a-b: {SCALE_WORKERS} workers >= {SCALE_NEED:g}x one worker and >= "
                      f"{RAW_NEED}x the raw echo) need {SCALE_WORKERS} serving cores beside wrk's; this machine has "
                      f"{len(serving)}, so only {', '.join(map(str, counts))} worker(s) were measured."]
    write_results("workers", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
