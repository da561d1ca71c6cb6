"""Benchmark: `auto` at K = 100 classes, n = 20,000 rows, the whole fit with its cross-fitted summary.

    .venv/bin/python benchmarks/auto_fit.py [--runs 2] [--no-baseline] [--k 100] [--n 20000]

Data: benchmarks/multiclass.py's synthetic case (overconfident logits 2.5 z* + offset, labels
from softmax(z*)), sent as logits and as probabilities (softmax of the logits). Each run is
``fit_calibrator("auto", ...)`` with default options, as ``POST /calibrators`` calls it, in this
process with BLAS held to one thread per thread (as the service's fit workers run).

Figures: wall seconds (``fit_seconds``, the whole time) and its parts (``summary.timings``:
validate, fit, summary), the CPU seconds of the process (all threads), the median over runs.
Baseline, measured in the same run on probabilities: the same fit done the way it was before
(one thread, ``matrix`` and ``dirichlet`` each fitted, and the summary cross-fitting the whole
choice, i.e. rerunning ``auto`` in each of its five folds). The summary's log-loss is printed for
both: the new summary is the chosen method's cross-fitted figure, the nested one also pays for the
choice. Target: the whole fit in at most 20 s on this 2-core machine (it shares the cores, so the
load average at the start is printed beside the figures).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from threadpoolctl import threadpool_limits  # noqa: E402

from calibd.calibration import auto, fit_calibrator  # noqa: E402
from multiclass import softmax, synthetic  # noqa: E402

TARGET_SECONDS = 20.0


def fit_once(scores: np.ndarray, labels: np.ndarray, input: str) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fit_calibrator("auto", input, None, scores, labels)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "wall": wall,
        "cpu": cpu,
        "fit_seconds": result.fit_seconds,
        **{f"t_{k}": v for k, v in result.summary["timings"].items()},
        "chosen": result.summary["fit"]["chosen"],
        "same_model_as": result.summary["fit"]["same_model_as"],
        "after_log_loss": result.summary["after"]["log_loss"],
        "of": result.summary["cross_fit"]["of"],
    }


class Before:
    """The fit as it was: one thread, twins each fitted, no out-of-fold reuse (nested summary)."""

    def __enter__(self):
        self.saved = (auto.available_threads, auto.model_key, auto.AutoCalibrator._fit)
        original_fit = self.saved[2]

        def fit_without_reuse(calibrator, *args, **kwargs):
            original_fit(calibrator, *args, **kwargs)
            del calibrator.out_of_fold_

        auto.available_threads = lambda: 1
        auto.model_key = lambda candidate: None
        auto.AutoCalibrator._fit = fit_without_reuse
        return self

    def __exit__(self, *exc):
        auto.available_threads, auto.model_key, auto.AutoCalibrator._fit = self.saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--no-baseline", action="store_true", help="skip the (slow) fit as it was before")
    args = parser.parse_args()
    threadpool_limits(1)  # as the service's fit workers

    data = synthetic(args.k, args.n, 10, seed=0)
    logits, labels = data["cal"]
    inputs = {"logit": logits, "probability": softmax(logits)}
    load = os.getloadavg()[0]
    print(
        f"# `auto` fit time, K = {args.k}, n = {args.n:,} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, {auto.available_threads()} fit threads, numpy {np.__version__}, "
        f"load average {load:.1f} at start)\n"
    )
    rows = []
    for input, scores in inputs.items():
        runs = [fit_once(scores, labels, input) for _ in range(args.runs)]
        rows.append((f"now, {input}", runs))
    if not args.no_baseline:
        with Before():
            rows.append(("before (nested summary, one thread), probability", [fit_once(inputs["probability"], labels, "probability")]))

    lines = [
        "| fit | runs | whole (fit_seconds) | validate | fit | summary | CPU (all threads) | chosen | summary log-loss | summary of |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    medians = {}
    for name, runs in rows:
        m = {key: float(np.median([r[key] for r in runs])) for key in ("wall", "cpu", "fit_seconds", "t_validate", "t_fit", "t_summary")}
        medians[name] = m
        last = runs[-1]
        twins = f" ({', '.join(f'{a} = {b}' for a, b in last['same_model_as'].items())})" if last["same_model_as"] else ""
        lines.append(
            f"| {name} | {len(runs)} | {m['fit_seconds']:.1f} s | {m['t_validate']:.2f} s | {m['t_fit']:.1f} s | "
            f"{m['t_summary']:.1f} s | {m['cpu']:.1f} s | {last['chosen']}{twins} | {last['after_log_loss']:.4f} | {last['of']} |"
        )
    print("\n".join(lines))
    print()
    worst = max(m["fit_seconds"] for name, m in medians.items() if name.startswith("now"))
    verdict = "met" if worst <= TARGET_SECONDS else "NOT met"
    print(f"Target: the whole fit in at most {TARGET_SECONDS:.0f} s: **{verdict}** (slowest input {worst:.1f} s, median of {args.runs}).")
    before = next((m for name, m in medians.items() if name.startswith("before")), None)
    if before is not None:
        now = medians["now, probability"]
        print(
            f"Against the fit as it was, in the same run (probabilities): {before['fit_seconds']:.1f} s -> "
            f"{now['fit_seconds']:.1f} s (ratio {now['fit_seconds'] / before['fit_seconds']:.3f}), "
            f"CPU {before['cpu']:.1f} s -> {now['cpu']:.1f} s."
        )


if __name__ == "__main__":
    main()
