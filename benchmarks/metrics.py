"""Benchmark: the ECE family on 10 million binary predictions, and interval_calibration's O(n log n).

    .venv/bin/python benchmarks/metrics.py [--runs 5]

Every figure is the median of ``--runs`` runs (at least 5) of the public
function, input validation included, next to the median time of ``np.sort``
of the same prediction array, run alternately with it, and the median of the
per-run ratios. For
interval_calibration a ratio that stays about constant from 10^5 to 10^7
shows that it scales as np.sort does, O(n log n). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.metrics import ece, interval_calibration, reliability_diagram  # noqa: E402
from app.metrics.binned import assign_bins, uniform_bins  # noqa: E402


def seconds(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def paired(function, baseline, runs: int) -> tuple[float, float, float]:
    """Median seconds of ``function`` and of ``baseline``, run alternately (so both see the same load
    on a shared machine), and the median of the per-run ratios."""
    pairs = [(seconds(function), seconds(baseline)) for _ in range(runs)]
    ours = statistics.median(a for a, _ in pairs)
    base = statistics.median(b for _, b in pairs)
    return ours, base, statistics.median(a / b for a, b in pairs)


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
    print(f"numpy {np.__version__}, {platform.processor() or platform.machine()}, median of {runs} runs\n")

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
    print("| computation | median s | np.sort median s | median ratio to np.sort |")
    print("|---|---|---|---|")
    for label, function in rows:
        ours, sort, ratio = paired(function, lambda: np.sort(p), runs)
        print(f"| {label} | {ours:.3f} | {sort:.3f} | {ratio:.2f} |")

    print("\n## interval_calibration against np.sort of the same array\n")
    print("| n | interval_calibration median s | np.sort median s | median ratio |")
    print("|---|---|---|---|")
    for n in (100_000, 1_000_000, 10_000_000):
        p, y = data(n, seed=1)
        ours, sort, ratio = paired(lambda: interval_calibration(p, y), lambda: np.sort(p), runs)
        print(f"| {n:,} | {ours:.4f} | {sort:.4f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
