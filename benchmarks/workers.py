"""Two uvicorn workers against one on the 100-score /calibrate workload (target 6 of issue 8).

    .venv/bin/python benchmarks/workers.py [--pairs 3] [--runs 3] [--seconds 3]

`calibd serve --workers 1` and `--workers 2` on the same SQLite database (the
calibrators fitted once), started in turn; against each, wrk (two threads,
16 connections, on the same two cores) posts the 100-score isotonic body to
/calibrate for ``--runs`` runs of ``--seconds`` after a warm-up that loads
the calibrator into every worker. Figures are medians; the ratio is the
median over pairs of (2 workers' median req/s) / (1 worker's). Target >= 1.6.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Server, Target, fmt_rate, machine, median, run_wrk, write_results  # noqa: E402
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
    rates: dict[int, list[float]] = {1: [], 2: []}
    latencies: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    ratios = []
    for pair in range(args.pairs):
        medians = {}
        for workers in ((1, 2) if pair % 2 == 0 else (2, 1)):
            with Server(database_url=url, workers=workers) as server:
                auth = server.headers["Authorization"]
                target = server.url + "/calibrate"
                run_wrk(target, body, auth, 3.0, args.connections, threads=2)  # every worker loads the calibrator
                results = [run_wrk(target, body, auth, args.seconds, args.connections, threads=2) for _ in range(args.runs)]
            medians[workers] = median([r.rate for r in results])
            rates[workers] += [r.rate for r in results]
            latencies[workers] += [(r.p50, r.p99) for r in results]
            print(f"  pair {pair + 1}, {workers} worker(s): {medians[workers]:,.0f} req/s", file=sys.stderr, flush=True)
        ratios.append(medians[2] / medians[1])
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()

    ratio = median(ratios)
    one, two = median(rates[1]), median(rates[2])
    lines = [
        "## Two uvicorn workers against one (target 6)",
        "",
        f"`benchmarks/workers.py --pairs {args.pairs} --runs {args.runs} --seconds {args.seconds:g}`; {started_machine}. "
        f"`calibd serve --workers N` (N > 1 sets PROMETHEUS_MULTIPROC_DIR), 100-score isotonic /calibrate, wrk -t2 "
        f"-c{args.connections} on the same 2 cores.",
        "",
        "| workers | req/s (median) | p50 | p99 | runs |",
        "|---:|---:|---:|---:|---|",
    ]
    for workers in (1, 2):
        lines.append(
            f"| {workers} | {fmt_rate(median(rates[workers]))} | {median([a for a, _ in latencies[workers]]) * 1e3:.2f} ms "
            f"| {median([b for _, b in latencies[workers]]) * 1e3:.2f} ms | {', '.join(fmt_rate(r) for r in rates[workers])} |"
        )
    lines += ["", f"2 workers / 1: **{ratio:.2f}** (each pair: {', '.join(f'{r:.2f}' for r in ratios)}); "
                  f"target >= 1.6: {'met' if ratio >= 1.6 else 'NOT met'}."]
    targets = [Target("6", "two uvicorn workers against one, 100-score /calibrate, wrk on the same cores",
                      f"{fmt_rate(two)} req/s", f"{fmt_rate(one)} req/s (one worker)", ratio, ">= 1.6x", ratio >= 1.6)]
    write_results("workers", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
