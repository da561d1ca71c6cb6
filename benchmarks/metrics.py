"""Benchmark: the ECE family on 10 million binary predictions, and interval_calibration's O(n log n).

    .venv/bin/python benchmarks/metrics.py [--runs 5]

Every figure is the median of ``--runs`` runs (at least 5) of the public
function, input validation included, next to the median time of ``np.sort``
of the same prediction array, run alternately with it, and the median of the
per-run ratios of CPU time. Wall and CPU time are both printed: everything
here is single-threaded, so CPU time is the wall time of an idle machine, and
the fair figure when other work shares the cores. For
interval_calibration a ratio that stays about constant from 10^5 to 10^7
shows that it scales as np.sort does, O(n log n). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibd.metrics import ece, interval_calibration, reliability_diagram  # noqa: E402
from calibd.metrics.binned import assign_bins, uniform_bins  # noqa: E402


def seconds(function) -> tuple[float, float]:
    """(wall, CPU) seconds of one call; everything measured here runs on one thread."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def paired(function, baseline, runs: int) -> dict[str, float]:
    """Medians of ``function`` and ``baseline`` run alternately (so both see the same load on a shared
    machine): wall and CPU seconds, and the median of the per-run CPU ratios."""
    pairs = [(seconds(function), seconds(baseline)) for _ in range(runs)]
    return {
        "wall": statistics.median(a[0] for a, _ in pairs),
        "cpu": statistics.median(a[1] for a, _ in pairs),
        "sort_wall": statistics.median(b[0] for _, b in pairs),
        "sort_cpu": statistics.median(b[1] for _, b in pairs),
        "ratio": statistics.median(a[1] / b[1] for a, b in pairs),
    }


def row(label: str, m: dict[str, float]) -> str:
    return (
        f"| {label} | {m['wall']:.4f} | {m['cpu']:.4f} | {m['sort_wall']:.4f} | {m['sort_cpu']:.4f} | {m['ratio']:.2f} |"
    )


HEADER = "| wall s | CPU s | np.sort wall s | np.sort CPU s | CPU ratio to np.sort |\n"


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    y = (rng.random(n) < p).astype(np.int8)
    return p, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = max(args.runs, 5)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"numpy {np.__version__}, {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f} at start, "
          f"median of {runs} runs (CPU time is the fair figure on a shared machine)\n")

    n = 10_000_000
    p, y = data(n)
    rows = [
        ("ece uniform l1 (15 bins)", lambda: ece(p, y, n_bins=15)),
        ("ece uniform l2 (RMSCE)", lambda: ece(p, y, n_bins=15, norm="l2")),
        ("ece uniform max (MCE)", lambda: ece(p, y, n_bins=15, norm="max")),
        ("ece quantile l1", lambda: ece(p, y, n_bins=15, binning="quantile")),
        ("ece top_label l1 (binary input)", lambda: ece(p, y, n_bins=15, target="top_label")),
        ("reliability diagram (15 bins)", lambda: reliability_diagram(p, y, n_bins=15)),
        ("bin index: floor(p 2^16) table + edge step (calibd)", lambda: uniform_bins(p, 15)),
        ("bin index: np.searchsorted", lambda: assign_bins(p, np.linspace(0, 1, 16))),
    ]
    print(f"## The ECE family on {n:,} binary predictions\n")
    print("| computation " + HEADER + "|---|---|---|---|---|---|")
    for label, function in rows:
        print(row(label, paired(function, lambda: np.sort(p), runs)))

    print("\n## interval_calibration against np.sort of the same array\n")
    print("| n (interval_calibration) " + HEADER + "|---|---|---|---|---|---|")
    for n in (100_000, 1_000_000, 10_000_000):
        p, y = data(n, seed=1)
        print(row(f"{n:,}", paired(lambda: interval_calibration(p, y), lambda: np.sort(p), runs)))


if __name__ == "__main__":
    main()
