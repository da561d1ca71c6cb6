"""POST /feedback into PostgreSQL, batches of 5,000, monitor aggregates included (targets 4a, 4b).

    .venv/bin/python benchmarks/feedback_ingest.py [--runs 3] [--batches 40] [--clients 4]

A `calibd serve` process (one uvicorn worker, auth on) on a fresh schema of the
local PostgreSQL (CALIBD_BENCH_POSTGRES_URL, default the `test` database).
Every request commits, in one transaction, its rows, the monitor buckets of
their minute and bins, and the drift test's new state.

* self-contained (4a): {"calibrator", "probabilities": 5,000, "labels": 5,000};
  measured against (4c) a plain psycopg COPY of the same rows, the same batches
  in one transaction each from as many concurrent connections, into a table
  equal to calibd's feedback table (``CREATE TABLE ... (LIKE feedback
  INCLUDING ALL)``: its columns, defaults and indexes), in the same run;
* by prediction id (4b): first /calibrate logs the predictions with ids
  (batches of 5,000 scores), the benchmark waits until the prediction log has
  written every one (it counts them in the database), then /feedback sends
  {"calibrator", "ids": 5,000, "labels": 5,000}, joined to the logged predictions.

``--clients`` clients post concurrently (httpx, keep-alive), each its share of
``--batches`` batches; items per second = items acknowledged / wall time from
the first request to the last answer. Median over ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    Server, Target, cpu_seconds, fmt_rate, machine, median, postgres_available, postgres_schema, process_tree, write_results,
)

BATCH = 5_000


def post_all(server: Server, bodies: list[bytes], clients: int) -> tuple[float, int]:
    """Post every body to /feedback; (seconds, items acknowledged)."""
    import httpx

    headers = {**server.headers, "Content-Type": "application/json"}
    shares = [bodies[i::clients] for i in range(clients)]

    def run(share: list[bytes]) -> int:
        count = 0
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
            for body in share:
                response = http.post("/feedback", content=body)
                if response.status_code != 202:
                    raise RuntimeError(f"/feedback: {response.status_code} {response.text[:300]}")
                receipt = response.json()
                if receipt["unknown_ids"] or receipt["expired_ids"]:
                    raise RuntimeError(f"/feedback: {len(receipt['unknown_ids'])} unknown ids")
                count += receipt["count"]
        return count

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        count = sum(pool.map(run, shares))
    return time.perf_counter() - started, count


def copy_all(url: str, batches: list[tuple[np.ndarray, np.ndarray]], clients: int) -> tuple[float, int]:
    """COPY the batches' rows into an equal table with plain psycopg; (seconds, rows)."""
    from datetime import datetime, timezone

    import psycopg

    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS feedback_copy_baseline")
        connection.execute("CREATE TABLE feedback_copy_baseline (LIKE feedback INCLUDING ALL)")
    statement = ("COPY feedback_copy_baseline (calibrator_id, version, prediction_id, probability, label, probabilities, "
                 "accepted, scores, received_at) FROM STDIN (FORMAT BINARY)")
    types = ["int4", "int4", "text", "float8", "int4", "jsonb", "bool", "jsonb", "timestamptz"]
    shares = [batches[i::clients] for i in range(clients)]

    def run(share: list) -> int:
        count = 0
        with psycopg.connect(conninfo) as connection:
            for p, y in share:
                now = datetime.now(timezone.utc)
                with connection.transaction(), connection.cursor() as cursor, cursor.copy(statement) as copy:
                    copy.set_types(types)
                    for probability, label in zip(p.tolist(), y.tolist()):
                        copy.write_row((1, 1, None, probability, label, None, None, None, now))
                count += len(p)
        return count

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        count = sum(pool.map(run, shares))
    return time.perf_counter() - started, count


def logged_predictions(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT count(*) FROM predictions")).scalar_one()
    finally:
        engine.dispose()


def machine_cpu_seconds() -> float:
    """CPU seconds every process on the machine has used (/proc/stat): PostgreSQL's backends come and go."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40, help="batches of 5,000 per run (default 40)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    args = parser.parse_args(argv)
    if not postgres_available():
        print("PostgreSQL unreachable: feedback_ingest not run", file=sys.stderr)
        write_results("feedback_ingest", "## POST /feedback into PostgreSQL (targets 4a, 4b)\n\nNot run: PostgreSQL unreachable.",
                      [Target("4a", "POST /feedback into PostgreSQL, self-contained", "not run", "", None, ">= 50,000/s", False,
                              "PostgreSQL unreachable"),
                       Target("4b", "POST /feedback into PostgreSQL, joined by prediction id", "not run", "", None,
                              ">= 20,000/s", False, "PostgreSQL unreachable")])
        return 1

    rng = np.random.default_rng(0)
    started_machine = machine()
    rates: dict[str, list[float]] = {"self": [], "ids": [], "copy": [], "copy_ratio": []}
    # CPU seconds per batch: the whole machine, the calibd process, the clients (this process).
    cpu: dict[str, list[tuple[float, float, float]]] = {"http": [], "copy": []}
    log_rates: list[float] = []
    with postgres_schema() as url, Server(database_url=url) as server:
        s = rng.random(20_000)
        server.fit("fb", "platt", s, (rng.random(s.shape[0]) < s).astype(int))
        serial = 0
        for run in range(args.runs):
            # -- self-contained -----------------------------------------------------
            bodies, rows = [], []
            for _ in range(args.batches):
                p = rng.random(BATCH)
                y = (rng.random(BATCH) < p).astype(int)
                rows.append((p, y))
                bodies.append(orjson.dumps({"calibrator": "fb", "probabilities": p.tolist(), "labels": y.tolist()}))
            # The service and the plain COPY of the same rows, back to back, their order alternating.
            for step in (("http", "copy") if run % 2 == 0 else ("copy", "http")):
                pids = process_tree(server.process.pid)
                before = machine_cpu_seconds(), cpu_seconds(pids), time.process_time()
                if step == "http":
                    seconds, count = post_all(server, bodies, args.clients)
                    rates["self"].append(count / seconds)
                else:
                    seconds, count = copy_all(url, rows, args.clients)
                    rates["copy"].append(count / seconds)
                after = machine_cpu_seconds(), cpu_seconds(pids), time.process_time()
                used = [(b - a) / args.batches for a, b in zip(before, after)]
                cpu[step].append((used[0], used[1] if step == "http" else 0.0, used[2]))
            rates["copy_ratio"].append(rates["self"][-1] / rates["copy"][-1])
            # -- by prediction id: log, wait for the log, label --------------------------
            before = logged_predictions(url)
            batches = []
            started = time.perf_counter()
            for _ in range(args.batches):
                ids = [f"r{serial + i}" for i in range(BATCH)]
                serial += BATCH
                server.post("/calibrate", {"calibrator": "fb", "scores": rng.random(BATCH).tolist(), "ids": ids})
                batches.append(ids)
            expected = before + args.batches * BATCH
            while logged_predictions(url) < expected:
                time.sleep(0.1)
            log_rates.append(args.batches * BATCH / (time.perf_counter() - started))
            bodies = [orjson.dumps({"calibrator": "fb", "ids": ids, "labels": rng.integers(0, 2, BATCH).tolist()})
                      for ids in batches]
            seconds, count = post_all(server, bodies, args.clients)
            rates["ids"].append(count / seconds)
            print(f"  run {run + 1}: self-contained {rates['self'][-1]:,.0f}/s (plain COPY {rates['copy'][-1]:,.0f}/s), "
                  f"by id {rates['ids'][-1]:,.0f}/s "
                  f"(predictions logged at {log_rates[-1]:,.0f}/s)", file=sys.stderr, flush=True)

    self_rate, id_rate = median(rates["self"]), median(rates["ids"])
    copy_rate, copy_ratio = median(rates["copy"]), median(rates["copy_ratio"])
    lines = [
        "## POST /feedback into PostgreSQL (targets 4a, 4b, 4c)",
        "",
        f"`benchmarks/feedback_ingest.py --runs {args.runs} --batches {args.batches} --clients {args.clients}`; "
        f"{started_machine}. One uvicorn worker, PostgreSQL 15 on the same machine; batches of {BATCH:,}; "
        f"{args.clients} concurrent clients; each request commits its rows, monitor buckets and drift state in one "
        "transaction. Items per second from the first request to the last answer; median over runs.",
        "",
        "| mode | items/s (each run) | target |",
        "|---|---:|---|",
        f"| self-contained (probabilities + labels) | **{fmt_rate(self_rate)}** ({', '.join(fmt_rate(r) for r in rates['self'])}) "
        f"| >= 50,000/s: {'met' if self_rate >= 50_000 else 'NOT met'} |",
        f"| by prediction id (ids + labels, joined to the prediction log) | **{fmt_rate(id_rate)}** "
        f"({', '.join(fmt_rate(r) for r in rates['ids'])}) | >= 20,000/s: {'met' if id_rate >= 20_000 else 'NOT met'} |",
        f"| (logging the predictions: /calibrate with ids until all are in the database) | {fmt_rate(median(log_rates))} | |",
        f"| plain psycopg COPY of the self-contained rows into an equal table | {fmt_rate(copy_rate)} "
        f"({', '.join(fmt_rate(r) for r in rates['copy'])}) | |",
        f"| **self-contained over plain COPY** | **{copy_ratio:.3f}** ({', '.join(f'{r:.2f}' for r in rates['copy_ratio'])}) "
        f"| >= 0.5x: {'met' if copy_ratio >= 0.5 else 'NOT met'} |",
        "",
        "Where the CPU goes, per batch of 5,000 (medians over runs; the machine's CPU from /proc/stat, so it includes "
        "PostgreSQL's backends and whatever else ran):",
        "",
        "| step | machine CPU / batch | calibd process | clients | the rest: PostgreSQL and other processes |",
        "|---|---:|---:|---:|---:|",
    ]
    for step, label in (("http", "POST /feedback, self-contained"), ("copy", "plain psycopg COPY")):
        machine_cpu, server_cpu, client_cpu = (median([c[i] for c in cpu[step]]) for i in range(3))
        lines.append(f"| {label} | {machine_cpu * 1e3:.1f} ms | {server_cpu * 1e3:.1f} ms | {client_cpu * 1e3:.1f} ms "
                     f"| {(machine_cpu - server_cpu - client_cpu) * 1e3:.1f} ms |")
    targets = [
        Target("4a", "POST /feedback into PostgreSQL, self-contained, batches of 5,000", f"{fmt_rate(self_rate)} items/s",
               "50,000 items/s (target)", self_rate / 50_000, ">= 50,000/s", self_rate >= 50_000,
               f"{args.clients} clients"),
        Target("4c", "POST /feedback into PostgreSQL, self-contained, batches of 5,000, over a plain psycopg COPY of the same rows",
               f"{fmt_rate(self_rate)} items/s", f"{fmt_rate(copy_rate)} rows/s (COPY into an equal table)", copy_ratio,
               ">= 0.5x", copy_ratio >= 0.5, f"{args.clients} clients / connections, same batches"),
        Target("4b", "POST /feedback into PostgreSQL, joined by prediction id, batches of 5,000",
               f"{fmt_rate(id_rate)} items/s", "20,000 items/s (target)", id_rate / 20_000, ">= 20,000/s",
               id_rate >= 20_000, f"{args.clients} clients"),
    ]
    write_results("feedback_ingest", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
