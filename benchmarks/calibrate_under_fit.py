"""/calibrate p99 latency while a 1,000,000-row isotonic fit runs, against without (target 2 of issue 8).

    .venv/bin/python benchmarks/calibrate_under_fit.py [--pairs 3] [--seconds 20]

One `calibd serve` process (one uvicorn worker, one fit worker process at
lower CPU priority, as deployed). Its idle capacity on the 100-score isotonic
workload is measured with wrk; then an open-loop client (benchmarks/_openloop.py,
its own process: request i leaves at t0 + i / rate, latency counted from that
scheduled time, wrk2-style) sends /calibrate at half that capacity, for
``--seconds`` with no fit and for ``--seconds`` while the benchmark keeps
POST /calibrators busy with a 1,000,000-row isotonic holdout (fit, cross-fitted
summary and store, back to back, the next posted as soon as one is answered).
The two windows alternate; the ratio is the median over pairs of p99 with the
fit / p99 without.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Server, Target, fmt_rate, machine, median, open_loop, run_wrk, write_results  # noqa: E402
import calibrate_throughput as ct  # noqa: E402


class FitLoop:
    """Posts the big fit again and again from a thread until stopped; records when fits ran."""

    def __init__(self, server: Server, body: bytes):
        self.server, self.body = server, body
        self.stop_event = threading.Event()
        self.spans: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        headers = {**self.server.headers, "Content-Type": "application/json"}
        with httpx.Client(base_url=self.server.url, headers=headers, timeout=900) as http:
            while not self.stop_event.is_set():
                started = time.monotonic()
                response = http.post("/calibrators", content=self.body)
                self.spans.append((started, time.monotonic()))
                if response.status_code != 201:
                    self.errors.append(f"{response.status_code} {response.text[:200]}")
                    return

    def __enter__(self) -> FitLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join()

    def busy_share(self, start: float, end: float) -> float:
        """Share of [start, end] during which a fit request was in flight."""
        busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans)
        return busy / (end - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="windows with and without the fit (default 3 each)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each window (default 20)")
    parser.add_argument("--fit-rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(2)
    body = ct.bodies(np.random.default_rng(0))["1b"]
    s = rng.random(args.fit_rows)
    y = (rng.random(args.fit_rows) < s**1.3).astype(int)
    big = orjson.dumps({"name": "big", "method": "isotonic", "holdout": {"scores": s.tolist(), "labels": y.tolist()}})
    started_machine = machine()
    rows = []
    with Server() as server:
        ct.fit_calibrators(server, np.random.default_rng(1))
        auth = server.headers["Authorization"]
        url = server.url + "/calibrate"
        run_wrk(url, body, auth, 2.0, 8)
        capacity = median([run_wrk(url, body, auth, 3.0, 8).rate for _ in range(3)])
        rate = capacity / 2
        open_loop(url, body, auth, rate, 3.0)  # warm-up of the client path
        fit_seconds = []
        for pair in range(args.pairs):
            for mode in (("idle", "fit") if pair % 2 == 0 else ("fit", "idle")):
                if mode == "idle":
                    result = open_loop(url, body, auth, rate, args.seconds)
                    share = 0.0
                else:
                    with FitLoop(server, big) as loop:
                        time.sleep(1.5)  # the body is posted and the fit under way
                        window_start = time.monotonic()
                        result = open_loop(url, body, auth, rate, args.seconds)
                        window_end = time.monotonic()
                    share = loop.busy_share(window_start, window_end)  # after the last fit has answered
                    if loop.errors:
                        raise RuntimeError(f"the fit failed: {loop.errors[0]}")
                    fit_seconds += [b - a for a, b in loop.spans]
                result.update(mode=mode, pair=pair, busy=share)
                rows.append(result)
                print(f"  pair {pair + 1} {mode}: p50 {result['p50'] * 1e3:.2f} ms, p99 {result['p99'] * 1e3:.2f} ms, "
                      f"max {result['max'] * 1e3:.1f} ms, {result['answered']}/{result['sent']} answered"
                      + (f", fit in flight {share:.0%} of the window" if mode == "fit" else ""), file=sys.stderr, flush=True)

    idle = [r for r in rows if r["mode"] == "idle"]
    fit = [r for r in rows if r["mode"] == "fit"]
    ratios = [f["p99"] / i["p99"] for i, f in zip(sorted(idle, key=lambda r: r["pair"]), sorted(fit, key=lambda r: r["pair"]))]
    ratio = median(ratios)
    p99_idle, p99_fit = median([r["p99"] for r in idle]), median([r["p99"] for r in fit])
    lines = [
        "## /calibrate p99 while a 1,000,000-row isotonic fit runs (target 2)",
        "",
        f"`benchmarks/calibrate_under_fit.py --pairs {args.pairs} --seconds {args.seconds:g}`; {started_machine}. "
        f"One uvicorn worker, one fit worker (nice 10). Idle capacity on the 100-score isotonic workload (wrk, 8 "
        f"connections): {fmt_rate(capacity)} req/s; the open-loop client sends {fmt_rate(rate)} req/s (half), latency "
        f"from each request's scheduled time. With the fit: POST /calibrators of {args.fit_rows:,} rows "
        f"({len(big) / 1e6:.0f} MB of JSON) back to back; each took {median(fit_seconds):.1f} s (median, "
        "body upload, parse, fit, 5-fold cross-fitted summary and store).",
        "",
        "| window | p50 | p90 | p99 | p99.9 | max | answered / sent | fit in flight |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} ({r['pair'] + 1}) | {r['p50'] * 1e3:.2f} ms | {r['p90'] * 1e3:.2f} ms | {r['p99'] * 1e3:.2f} ms "
            f"| {r['p999'] * 1e3:.1f} ms | {r['max'] * 1e3:.1f} ms | {r['answered']:,} / {r['sent']:,} "
            f"| {r['busy']:.0%} |"
        )
    lines += [
        "",
        f"p99 with the fit / without: **{ratio:.2f}** (each pair: {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"target <= 2: {'met' if ratio <= 2 else 'NOT met'}.",
    ]
    targets = [Target(
        "2", "/calibrate p99 while a 1,000,000-row isotonic fit runs (half the idle capacity, open loop)",
        f"p99 {p99_fit * 1e3:.2f} ms with the fit", f"p99 {p99_idle * 1e3:.2f} ms without", ratio, "<= 2x", ratio <= 2,
        f"{fmt_rate(rate)} req/s",
    )]
    write_results("calibrate_under_fit", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
