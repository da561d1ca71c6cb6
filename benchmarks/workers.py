"""Two uvicorn workers against one on the 100-score /calibrate workload (target 6 of issue 8).

    .venv/bin/python benchmarks/workers.py [--pairs 3] [--runs 3] [--seconds 3]

`calibd serve --workers 1` and `--workers 2` on the same SQLite database (the
calibrators fitted once), started in turn; against each, wrk (two threads,
16 connections, on the same two cores) posts the 100-score isotonic body to
/calibrate for ``--runs`` runs of ``--seconds`` after a warm-up that loads
the calibrator into every worker, once the server has settled (its fit
workers import their modules after it answers). Figures are medians; the ratio is the
median over pairs of (2 workers' median req/s) / (1 worker's). Target >= 1.6.

The bare echo app (benchmarks/echo_app.py: uvicorn with the same flags and
worker count, orjson in and out) is measured the same way in the same pairs:
its two-worker ratio is what this machine allows any uvicorn server with wrk
on the same two cores. The CPU seconds per request of the servers (every
worker) and of wrk show where the cores go.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    EchoServer, Server, Target, cpu_seconds, fmt_rate, machine, median, process_tree, run_wrk, settle, write_results,
)
import calibrate_throughput as ct  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)

    body = ct.bodies(np.random.default_rng(0))["1b"]
    started_machine = machine()
    folder = Path(tempfile.mkdtemp(prefix="calibd-workers-"))
    url = f"sqlite:///{folder / 'calibd.db'}"
    with Server(database_url=url) as server:
        ct.fit_calibrators(server, np.random.default_rng(1))
    kinds = ("calibd", "echo")
    rates = {(kind, n): [] for kind in kinds for n in (1, 2)}
    latencies = {(kind, n): [] for kind in kinds for n in (1, 2)}
    # (server, wrk, log collector) CPU seconds per request; the collector is this process, reading
    # the server's access lines from its pipe as a container's log collector would.
    cpu = {(kind, n): [] for kind in kinds for n in (1, 2)}
    ratios: dict[str, list[float]] = {kind: [] for kind in kinds}
    for pair in range(args.pairs):
        medians = {}
        order = [(kind, n) for kind in kinds for n in (1, 2)]
        for kind, workers in (order if pair % 2 == 0 else order[::-1]):
            with (Server(database_url=url, workers=workers) if kind == "calibd" else EchoServer(workers)) as server:
                # The echo gets an Authorization header of the same length, unread.
                auth = server.headers["Authorization"] if kind == "calibd" else "Bearer " + "0" * 54
                target = server.url + "/calibrate" if kind == "calibd" else server.url
                settle(server.process.pid)
                run_wrk(target, body, auth, 3.0, args.connections, threads=2)  # every worker loads the calibrator
                pids = process_tree(server.process.pid)
                results = []
                for _ in range(args.runs):
                    server_before, wrk_before, own_before = cpu_seconds(pids), _children_cpu(), time.process_time()
                    result = run_wrk(target, body, auth, args.seconds, args.connections, threads=2)
                    cpu[kind, workers].append(((cpu_seconds(pids) - server_before) / result.requests,
                                               (_children_cpu() - wrk_before) / result.requests,
                                               (time.process_time() - own_before) / result.requests))
                    results.append(result)
            medians[kind, workers] = median([r.rate for r in results])
            rates[kind, workers] += [r.rate for r in results]
            latencies[kind, workers] += [(r.p50, r.p99) for r in results]
            print(f"  pair {pair + 1}, {kind}, {workers} worker(s): {medians[kind, workers]:,.0f} req/s", file=sys.stderr, flush=True)
        for kind in kinds:
            ratios[kind].append(medians[kind, 2] / medians[kind, 1])
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()

    ratio, echo_ratio = median(ratios["calibd"]), median(ratios["echo"])
    one, two = median(rates["calibd", 1]), median(rates["calibd", 2])
    lines = [
        "## Two uvicorn workers against one (target 6)",
        "",
        f"`benchmarks/workers.py --pairs {args.pairs} --runs {args.runs} --seconds {args.seconds:g}`; {started_machine}. "
        f"`calibd serve --workers N` (N > 1 sets PROMETHEUS_MULTIPROC_DIR), 100-score isotonic /calibrate, and the bare "
        f"echo app with the same uvicorn flags and worker count, same body; wrk -t2 -c{args.connections} on the same 2 "
        "cores; the four servers interleaved in each pair. CPU per request: user + system seconds of the server (all its "
        "workers), of wrk, and of the log collector (the benchmark process reading calibd's access lines from its "
        "pipe; the echo writes none), over the same runs.",
        "",
        "| server | workers | req/s (median) | p50 | p99 | server CPU / request | wrk CPU / request | log collector CPU / request | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for kind in kinds:
        for workers in (1, 2):
            key = kind, workers
            lines.append(
                f"| {'calibd' if kind == 'calibd' else 'bare echo'} | {workers} | {fmt_rate(median(rates[key]))} "
                f"| {median([a for a, _ in latencies[key]]) * 1e3:.2f} ms | {median([b for _, b in latencies[key]]) * 1e3:.2f} ms "
                f"| {median([c[0] for c in cpu[key]]) * 1e6:.0f} us | {median([c[1] for c in cpu[key]]) * 1e6:.0f} us "
                f"| {median([c[2] for c in cpu[key]]) * 1e6:.0f} us "
                f"| {', '.join(fmt_rate(r) for r in rates[key])} |"
            )
    lines += ["", f"calibd, 2 workers / 1: **{ratio:.2f}** (each pair: {', '.join(f'{r:.2f}' for r in ratios['calibd'])}); "
                  f"target >= 1.6: {'met' if ratio >= 1.6 else 'NOT met'}.",
              f"The bare echo, 2 workers / 1, in the same pairs: **{echo_ratio:.2f}** "
              f"(each pair: {', '.join(f'{r:.2f}' for r in ratios['echo'])}).",
              f"calibd's scaling over the echo's: {ratio / echo_ratio:.2f}."]
    lines += ["", "The ceiling the CPU per request sets (wrk shares the two cores): one worker can use at most one core, so "
              "at most 1 / s1 requests a second (s1: its CPU per request); two workers and wrk share two, so at most "
              "2 / (s2 + w) (s2: the two workers' CPU per request, w: wrk's). The most two workers can gain is "
              "2 s1 / (s2 + w):", ""]
    for kind in kinds:
        s1 = median([c[0] for c in cpu[kind, 1]])
        s2, w = median([c[0] for c in cpu[kind, 2]]), median([c[1] for c in cpu[kind, 2]])
        lines.append(f"- {'calibd' if kind == 'calibd' else 'bare echo'}: 2 x {s1 * 1e6:.0f} us / ({s2 * 1e6:.0f} us + "
                     f"{w * 1e6:.0f} us) = **{2 * s1 / (s2 + w):.2f}**")
    targets = [Target("6", "two uvicorn workers against one, 100-score /calibrate, wrk on the same cores "
                      f"(the bare echo's own ratio in the same run: {echo_ratio:.2f})",
                      f"{fmt_rate(two)} req/s", f"{fmt_rate(one)} req/s (one worker)", ratio, ">= 1.6x", ratio >= 1.6)]
    write_results("workers", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children: wrk, once each run has ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
