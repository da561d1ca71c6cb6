"""Assemble benchmarks/RESULTS.md from benchmarks/results/.

    .venv/bin/python benchmarks/report.py

Each benchmark writes its own section, ``results/<name>.md``, and the service
benchmarks also ``results/<name>.json``, their rows of the targets table.
This script only reads those files, so running one benchmark (which calls
``assemble()`` when it finishes) keeps every other benchmark's last section.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OUT = BENCH / "RESULTS.md"

#: Sections in this order; any other section file follows, alphabetically.
ORDER = [
    "calibrate_throughput",
    "calibrate_instructions",
    "calibrate_under_fit",
    "fit_times",
    "feedback_ingest",
    "calibrate_memory",
    "workers",
    "first_fit",
    "calibrate_profile",
    "hot_path_profile",
    "layer_profile",
    "metrics",
    "metrics_reference",
    "multiclass",
    "auto_fit",
    "monitor_sim",
    "segment_drift",
    "label_delay",
    "label_timing_cost",
    "angular",
    "bernstein",
    "selective",
    "closed_loop",
    "parquet_fit",
    "segments",
    "oip",
    "streams_ingest",
    "streams_ingest_cloudevents",
    "streams_ingest_intake",
    "transformer_latency",
]

#: Every target of issue 8, so that one not yet measured still shows as a row.
TARGETS = {
    "1a": "/calibrate throughput, isotonic, 1 score",
    "1b": "/calibrate throughput, isotonic, 100 scores",
    "1c": "/calibrate throughput, isotonic, 10,000 scores",
    "1d": "/calibrate throughput, temperature, 100 rows x 10 classes",
    "2": "/calibrate p99 while a 1,000,000-row isotonic fit runs",
    "3a": "isotonic fit + predict, n = 1,000,000",
    "3b": "Platt fit, n = 1,000,000",
    "3c": "beta fit, n = 1,000,000",
    "4a": "POST /feedback into PostgreSQL, self-contained",
    "4b": "POST /feedback into PostgreSQL, joined by prediction id",
    "4c": "POST /feedback into PostgreSQL, self-contained, over a plain psycopg COPY of the same rows",
    "5": "RSS growth over 100,000 /calibrate requests",
    "6": "two uvicorn workers against one, 100 scores (replaced by 32.3a-b: benchmarks/workers.py now pins servers and wrk apart)",
    "7": "POST /calibrators, isotonic, 5,000,000 rows: Parquet against JSON",
    "32.3a": "calibd at 8 uvicorn workers over 1, servers and wrk on disjoint cores (benchmarks/workers.py; needs 16 cores)",
    "32.3b": "calibd over the raw ASGI echo at 8 workers (benchmarks/workers.py; needs 16 cores)",
}


def _key(key: str) -> tuple[int, str]:
    match = re.match(r"(\d+)(.*)", key)
    return (int(match.group(1)), match.group(2)) if match else (99, key)


def targets_table() -> list[str]:
    rows: dict[str, tuple[dict, str]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        for target in data.get("targets", []):
            rows[target["key"]] = (target, data.get("measured_at", ""))
    lines = [
        "| # | target | measured | baseline | ratio | requirement | met | measured at |",
        "|---|---|---|---|---:|---|---|---|",
    ]
    for key in sorted(set(TARGETS) | set(rows), key=_key):
        if key not in rows:
            lines.append(f"| {key} | {TARGETS[key]} | not measured yet | | | | | |")
            continue
        t, stamp = rows[key]
        ratio = "" if t["ratio"] is None else f"{t['ratio']:.3f}"
        met = "**met**" if t["met"] else "**NOT met**"
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(
            f"| {key} | {t['target']}{note} | {t['figure']} | {t['baseline']} | {ratio} | {t['requirement']} | {met} | {stamp} |"
        )
    return lines


def assemble() -> Path:
    RESULTS.mkdir(exist_ok=True)
    sections = {path.stem: path.read_text().rstrip() for path in RESULTS.glob("*.md")}
    ordered = [name for name in ORDER if name in sections] + sorted(set(sections) - set(ORDER))
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (every benchmark, then this file) or by any one benchmark, which rewrites its own",
        "section in `benchmarks/results/` and reassembles this file from all of them (`benchmarks/report.py`).",
        "Figures are medians over repeated runs on a shared 2-core machine; every ratio is against a baseline",
        "measured in the same run, which is the figure that carries over to another machine.",
        "",
        "## Targets of issue 8",
        "",
        *targets_table(),
        "",
    ]
    for name in ordered:
        lines += [sections[name], ""]
    OUT.write_text("\n".join(lines).rstrip() + "\n")
    return OUT


if __name__ == "__main__":
    print(assemble())
