"""Run every benchmark in benchmarks/ and rebuild benchmarks/RESULTS.md (`make bench`).

    .venv/bin/python benchmarks/run_all.py [--only NAME,...] [--skip NAME,...] [--quick]

The service benchmarks (issue 8's targets) write their own sections and target
rows into benchmarks/results/; the others print markdown, which is captured
into results/<name>.md with the command that made it. Then RESULTS.md is
assembled from every file in results/ (benchmarks/report.py), so a benchmark
that is skipped or fails keeps, or loses with a note, only its own section.
``--quick`` passes every script smaller arguments: a smoke run, not figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
sys.path.insert(0, str(BENCH))

#: name: (arguments, --quick arguments). The service benchmarks of issue 8 first.
OWN = {
    "calibrate_throughput": ([], ["--runs", "2", "--seconds", "1", "--no-postgres", "--no-mlserver"]),
    "calibrate_under_fit": ([], ["--pairs", "1", "--seconds", "5", "--fit-rows", "200000"]),
    "fit_times": ([], ["--runs", "1", "--n", "200000"]),
    "feedback_ingest": ([], ["--runs", "1", "--batches", "4"]),
    "streams_ingest": ([], ["--runs", "1", "--batches", "2", "--pairs", "100"]),
    "calibrate_memory": ([], ["--requests", "3000", "--chunk-seconds", "1"]),
    "workers": ([], ["--runs", "1", "--seconds", "1"]),
    "first_fit": ([], ["--starts", "1"]),
    "calibrate_profile": ([], ["--requests", "200", "--no-py-spy"]),
    "hot_path_profile": ([], ["--workloads", "1b", "--seconds", "2"]),
    "layer_profile": ([], ["--batches", "3", "--batch", "50"]),
    "parquet_fit": ([], ["--rows", "200000", "--runs", "1"]),
    "segments": ([], ["--quick"]),
    "oip": ([], ["--runs", "1", "--seconds", "1", "--latency-requests", "200", "--no-kserve"]),
    "transformer_latency": ([], ["--pairs", "100", "--no-kserve"]),
}
#: The other benchmarks, at the sizes their issues ask for (K = 100 tables, 2,000 drift streams, five angular
#: seeds); multiclass with fewer timing runs and seeds than its defaults.
OTHERS = {
    "metrics": (["--runs", "5"], ["--runs", "5"]),  # 5 is its minimum
    "multiclass": (["--runs", "3", "--seeds", "2"], ["--runs", "3", "--seeds", "1", "--quick"]),
    "monitor_sim": (["--workers", "2"], ["--streams", "20", "--batches", "10", "--naive-calibration", "500"]),
    "angular": (["--seeds", "5"], ["--seeds", "1", "--n", "400", "--d", "800", "--sign-trials", "50"]),
    "bernstein": (["--no-solvers"],
                  ["--rounds", "1", "--test-size", "50000", "--no-solvers", "--no-times"]),
    "selective": ([], ["--quick"]),
    "auto_fit": ([], ["--runs", "1", "--k", "20", "--n", "4000"]),
    "closed_loop": ([], ["--batches", "16", "--drift-at", "6", "--batch-size", "500"]),
}


def ensure_wrk() -> bool:
    if shutil.which("wrk"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk is missing: apt-get install -y wrk", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "wrk"], stdout=subprocess.DEVNULL)
    if shutil.which("wrk"):
        return True
    print("wrk is not installed (apt-get install wrk): the wrk-based benchmarks will fail", file=sys.stderr)
    return False


def run(name: str, arguments: list[str], own: bool) -> bool:
    command = [sys.executable, str(BENCH / f"{name}.py"), *arguments]
    shown = " ".join(["benchmarks/" + f"{name}.py", *arguments])
    print(f"== {shown}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    process = subprocess.run(command, stdout=subprocess.PIPE, stderr=None if own else subprocess.PIPE, text=True,
                             cwd=BENCH.parent)
    elapsed = time.perf_counter() - started
    print(f"   {'ok' if process.returncode == 0 else f'FAILED ({process.returncode})'} in {elapsed:.0f} s",
          file=sys.stderr, flush=True)
    RESULTS.mkdir(exist_ok=True)
    if own and process.returncode == 0:
        return True  # it wrote its own section and target rows
    if process.returncode != 0:
        tail = ((process.stderr or "") + (process.stdout or ""))[-3000:] if not own else (process.stdout or "")[-3000:]
        (RESULTS / f"{name}.md").write_text(
            f"## {name}\n\n`{shown}` FAILED (exit status {process.returncode}) at {stamp} after {elapsed:.0f} s; "
            f"its figures are not current.\n\n```\n{tail.strip()}\n```\n"
        )
        stale = RESULTS / f"{name}.json"
        if stale.exists():
            stale.unlink()  # its targets show as not measured rather than as old figures
        return False
    (RESULTS / f"{name}.md").write_text(
        f"## {name}.py\n\n`{shown}` at {stamp}, {elapsed:.0f} s (the script's own output follows).\n\n"
        + process.stdout.strip() + "\n"
    )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated names to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated names not to run")
    parser.add_argument("--quick", action="store_true", help="small arguments everywhere: a smoke run")
    args = parser.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    ensure_wrk()
    failed = []
    for own, table in ((True, OWN), (False, OTHERS)):
        for name, (normal, quick) in table.items():
            if (only and name not in only) or name in skip:
                continue
            if not run(name, quick if args.quick else normal, own):
                failed.append(name)
    import report

    print(report.assemble(), file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
