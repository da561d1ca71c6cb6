"""RSS of the serving process over 100,000 /calibrate requests after warm-up (target 5 of issue 8).

    .venv/bin/python benchmarks/calibrate_memory.py [--requests 100000] [--chunk-seconds 4]

One `calibd serve` process (one uvicorn worker). Warm-up: wrk on each
workload for a few seconds (isotonic with 1, 100 and 10,000 scores, temperature
100 x 10). Then wrk runs of ``--chunk-seconds``, cycling through the isotonic
1 and 100 score and the temperature workloads, until at least ``--requests``
requests have been answered; the process's resident set size (VmRSS) is read
after warm-up and after every run. Target: it grows by less than 20 MB.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Server, Target, machine, rss_bytes, run_wrk, write_results  # noqa: E402
import calibrate_throughput as ct  # noqa: E402

MB = 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--chunk-seconds", type=float, default=4.0)
    args = parser.parse_args(argv)

    payloads = ct.bodies(np.random.default_rng(0))
    started_machine = machine()
    cycle = ["1b", "1a", "1d"]
    samples = []
    with Server() as server:
        ct.fit_calibrators(server, np.random.default_rng(1))
        auth = server.headers["Authorization"]
        url = server.url + "/calibrate"
        pid = server.process.pid
        start_rss = rss_bytes(pid)
        warm = 0
        for key in ("1a", "1b", "1c", "1d"):
            warm += run_wrk(url, payloads[key], auth, 2.0 if key == "1c" else 4.0, 8).requests
        warm_rss = rss_bytes(pid)
        done = 0
        index = 0
        while done < args.requests:
            key = cycle[index % len(cycle)]
            result = run_wrk(url, payloads[key], auth, args.chunk_seconds, 8)
            done += result.requests
            index += 1
            samples.append((done, key, rss_bytes(pid)))
            print(f"  {done:,} requests: RSS {samples[-1][2] / MB:.1f} MB", file=sys.stderr, flush=True)
    end_rss = samples[-1][2]
    growth = (end_rss - warm_rss) / MB
    peak = max(r for _, _, r in samples)
    labels = {"1a": "isotonic, 1", "1b": "isotonic, 100", "1d": "temperature, 100 x 10"}
    lines = [
        "## Memory over 100,000 /calibrate requests (target 5)",
        "",
        f"`benchmarks/calibrate_memory.py --requests {args.requests} --chunk-seconds {args.chunk_seconds:g}`; "
        f"{started_machine}. RSS of the serving process: {start_rss / MB:.1f} MB after start and fits, "
        f"{warm_rss / MB:.1f} MB after warm-up ({warm:,} requests), {end_rss / MB:.1f} MB after {samples[-1][0]:,} more requests (peak {peak / MB:.1f} MB): growth "
        f"**{growth:+.1f} MB**, target < 20 MB: {'met' if growth < 20 else 'NOT met'}.",
        "",
        "| requests after warm-up | last chunk's workload | RSS |",
        "|---:|---|---:|",
        *(f"| {done:,} | {labels[key]} | {rss / MB:.1f} MB |" for done, key, rss in samples),
    ]
    targets = [Target("5", "RSS growth over 100,000 /calibrate requests after warm-up", f"{growth:+.1f} MB",
                      f"{warm_rss / MB:.1f} MB after warm-up", growth / 20.0, "< 20 MB", growth < 20,
                      f"{end_rss / MB:.1f} MB at the end")]
    write_results("calibrate_memory", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
