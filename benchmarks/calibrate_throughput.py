"""/calibrate throughput against a baseline route in the same app (targets 1a-1d of issue 8).

    .venv/bin/python benchmarks/calibrate_throughput.py [--runs 5] [--seconds 3] [--no-postgres]

One `calibd serve` process (one uvicorn worker, auth on, JSON access logs on,
as deployed) with CALIBD_BENCHMARK_ROUTES=1, which adds
POST /benchmark/calibrate-baseline: the same request read, parsed and checked
by the same code, behind the same middleware and auth dependency, its scores
made the float64 array /calibrate hands its calibrator (batches of more than
256; shorter ones stay lists, as /calibrate passes them), answered with that
equal-sized array without calibrating. The
ratio of /calibrate's throughput to the baseline's is the share of the
HTTP + JSON floor that calibration leaves; it holds on a busy machine where
absolute figures do not.

Load: wrk (one thread, --connections keep-alive connections) from its own
process on loopback, posting one fixed body per workload. The server's threads
are pinned to one core and wrk to the other (``split_cpus``), so that the
kernel's placement of the two does not move the figures from run to run:
  * isotonic, batches of 1, 100 and 10,000 binary scores (probabilities drawn
    uniformly, full double precision, so the answer is the size of the request);
  * temperature, 100 rows x 10 classes (logits).
Each run measures the baseline and /calibrate back to back (their order
alternating between runs); figures are medians over runs, the ratio is the
median of the per-run ratios. The same is repeated against PostgreSQL (the
hot path never reads the database after warm-up, so it should not differ).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    Server, Target, fmt_rate, machine, median, postgres_available, postgres_schema, run_wrk, split_cpus,
    write_results,
)

WORKLOADS = [
    # key, label, calibrator, shape, requirement
    ("1a", "isotonic, 1 score", "iso", (1,), 0.9),
    ("1b", "isotonic, 100 scores", "iso", (100,), 0.9),
    ("1c", "isotonic, 10,000 scores", "iso", (10_000,), 0.7),
    ("1d", "temperature, 100 rows x 10 classes", "temp10", (100, 10), 0.9),
]


def fit_calibrators(server: Server, rng: np.random.Generator) -> dict[str, int]:
    """An isotonic calibrator on 50,000 rows and a 10-class temperature calibrator; their sizes."""
    s = rng.random(50_000)
    y = (rng.random(s.shape[0]) < s**1.4).astype(int)
    iso = server.fit("iso", "isotonic", s, y)
    z = rng.normal(0.0, 2.0, size=(5_000, 10))
    p = np.exp(z / 1.7)
    p /= p.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(10, p=row) for row in p])
    server.fit("temp10", "temperature", z, labels, input="logit")
    return {"iso_thresholds": iso["summary"]["fit"]["n_thresholds"]}


def bodies(rng: np.random.Generator) -> dict[str, bytes]:
    out = {}
    for key, _, name, shape, _ in WORKLOADS:
        scores = rng.random(shape) if name == "iso" else rng.normal(0.0, 2.0, size=shape)
        out[key] = orjson.dumps({"calibrator": name, "scores": scores.tolist()})
    return out


def measure(server: Server, payloads: dict[str, bytes], runs: int, seconds: float, connections: int) -> dict:
    auth = server.headers["Authorization"]
    pids = server.serving_pids()
    cpus = split_cpus(pids)  # the server on one core, wrk on the other
    routes = {"baseline": server.url + "/benchmark/calibrate-baseline", "calibrate": server.url + "/calibrate"}
    for key, body in payloads.items():  # warm-up: caches, code paths, allocator
        for url in routes.values():
            run_wrk(url, body, auth, 1.0, connections, cpus=cpus)
    results: dict[str, dict[str, list]] = {
        key: {"baseline": [], "calibrate": [], "ratio": [], "cpu_ratio": []} for key in payloads
    }
    for run in range(runs):
        for key, body in payloads.items():
            order = ("baseline", "calibrate") if run % 2 == 0 else ("calibrate", "baseline")
            got = {route: run_wrk(routes[route], body, auth, seconds, connections, server_pids=pids, cpus=cpus)
                   for route in order}
            results[key]["baseline"].append(got["baseline"])
            results[key]["calibrate"].append(got["calibrate"])
            results[key]["ratio"].append(got["calibrate"].rate / got["baseline"].rate)
            results[key]["cpu_ratio"].append(got["baseline"].server_cpu / got["calibrate"].server_cpu)
            print(f"  run {run + 1} {key}: baseline {got['baseline'].rate:,.0f}/s, calibrate "
                  f"{got['calibrate'].rate:,.0f}/s, ratio {results[key]['ratio'][-1]:.3f} "
                  f"(server CPU ratio {results[key]['cpu_ratio'][-1]:.3f})", file=sys.stderr, flush=True)
    return results


def summarise(results: dict) -> dict[str, dict]:
    summary = {}
    for key, r in results.items():
        summary[key] = {
            "baseline_rate": median([x.rate for x in r["baseline"]]),
            "calibrate_rate": median([x.rate for x in r["calibrate"]]),
            "baseline_p50": median([x.p50 for x in r["baseline"]]),
            "baseline_p99": median([x.p99 for x in r["baseline"]]),
            "calibrate_p50": median([x.p50 for x in r["calibrate"]]),
            "calibrate_p99": median([x.p99 for x in r["calibrate"]]),
            "ratio": median(r["ratio"]),
            "ratios": r["ratio"],
            "cpu_ratio": median(r["cpu_ratio"]),
            "baseline_cpu": median([x.server_cpu for x in r["baseline"]]),
            "calibrate_cpu": median([x.server_cpu for x in r["calibrate"]]),
        }
    return summary


def table(summary: dict[str, dict]) -> list[str]:
    lines = [
        "| workload | baseline req/s | /calibrate req/s | ratio (each run) | baseline p50 / p99 | /calibrate p50 / p99 "
        "| server CPU per request, baseline / /calibrate (ratio) | target |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for key, label, _, _, need in WORKLOADS:
        s = summary[key]
        runs = ", ".join(f"{r:.2f}" for r in s["ratios"])
        lines.append(
            f"| {label} | {fmt_rate(s['baseline_rate'])} | {fmt_rate(s['calibrate_rate'])} | **{s['ratio']:.3f}** ({runs}) "
            f"| {s['baseline_p50'] * 1e3:.2f} / {s['baseline_p99'] * 1e3:.2f} ms "
            f"| {s['calibrate_p50'] * 1e3:.2f} / {s['calibrate_p99'] * 1e3:.2f} ms "
            f"| {s['baseline_cpu'] * 1e6:.0f} / {s['calibrate_cpu'] * 1e6:.0f} us ({s['cpu_ratio']:.3f}) "
            f"| >= {need}x: {'met' if s['ratio'] >= need else 'NOT met'} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="paired runs per workload (default 11)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each wrk run (default 2)")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections (default 8)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    payloads = bodies(rng)
    backends = [("SQLite", None)]
    if not args.no_postgres and postgres_available():
        backends.append(("PostgreSQL", "postgres"))
    summaries, info = {}, {}
    started_machine = machine()
    for label, kind in backends:
        print(f"{label}:", file=sys.stderr, flush=True)
        if kind == "postgres":
            with postgres_schema() as url, Server(database_url=url) as server:
                info[label] = fit_calibrators(server, np.random.default_rng(1))
                summaries[label] = summarise(measure(server, payloads, args.runs, args.seconds, args.connections))
        else:
            with Server() as server:
                info[label] = fit_calibrators(server, np.random.default_rng(1))
                summaries[label] = summarise(measure(server, payloads, args.runs, args.seconds, args.connections))

    lines = [
        "## /calibrate throughput (targets 1a-1d)",
        "",
        f"`benchmarks/calibrate_throughput.py --runs {args.runs} --seconds {args.seconds:g} --connections {args.connections}`; "
        f"{started_machine}. One uvicorn worker (`calibd serve`), auth on, JSON access log on, pinned to one core; "
        f"wrk -t1 -c{args.connections} from its own process, on the other. Baseline: `POST /benchmark/calibrate-baseline` in the same app "
        "(CALIBD_BENCHMARK_ROUTES=1): same body parsing, envelope checks, middleware and auth, scores made the "
        "float64 array /calibrate hands its calibrator (more than 256 scores or rows; shorter batches stay lists, "
        "as /calibrate passes them), answered without calibrating. What that conversion costs by itself is in the "
        "profile section below (step B). Ratio = median over runs of /calibrate req/s / baseline req/s, measured back to back; "
        "the server's CPU time per request (from /proc) is shown beside it, a figure less moved by the machine's "
        "other jobs than throughput. "
        f"Isotonic calibrator: {info['SQLite']['iso_thresholds']} thresholds (50,000-row holdout).",
        "",
    ]
    for label in summaries:
        lines += [f"### {label}", "", *table(summaries[label]), ""]
    sqlite = summaries["SQLite"]
    targets = [
        Target(
            key=key, target=f"/calibrate throughput, {label}",
            figure=f"{fmt_rate(sqlite[key]['calibrate_rate'])} req/s (p50 {sqlite[key]['calibrate_p50'] * 1e3:.2f} ms, "
                   f"p99 {sqlite[key]['calibrate_p99'] * 1e3:.2f} ms)",
            baseline=f"{fmt_rate(sqlite[key]['baseline_rate'])} req/s (baseline route)",
            ratio=sqlite[key]["ratio"], requirement=f">= {need}x", met=sqlite[key]["ratio"] >= need,
            note="SQLite" + (
                f"; PostgreSQL {summaries['PostgreSQL'][key]['ratio']:.3f}x" if "PostgreSQL" in summaries else ""),
        )
        for key, label, _, _, need in WORKLOADS
    ]
    write_results("calibrate_throughput", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
