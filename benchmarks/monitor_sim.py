"""Drift-monitor simulation: false alarms, power and delay of the anytime-valid drift test.

    .venv/bin/python benchmarks/monitor_sim.py                 # the issue's size, a few minutes
    .venv/bin/python benchmarks/monitor_sim.py --streams 200   # a quick look

Each stream is ``--batches`` batches of ``--labels`` labelled predictions.
Predictions are p = sigmoid(z) with z ~ Normal(mu, 1), mu chosen so that the
mean prediction is the base rate (5%); labels are drawn from the true
probability sigmoid(eta), with eta = z (calibrated) until batch ``--change``
(0-based) and the scenario's eta from then on. Every stream is fed to
``ParallelDriftTests`` at tolerance 0 and at the service tolerance, on the
same data.

Reported per scenario and tolerance: the share of streams that ever alarm;
the share that alarm before the change (false alarms); the share that alarm
at or after it (detections); and the delay of the detections, in batches, where
delay d means the alarm came with the d-th drifted batch (1 = the first).
Where the scenario lies inside the null (no drift, or drift within the
tolerance) every alarm is a false alarm.

For contrast, the naive monitor: the 15-bin ECE of each batch against a fixed
threshold, the 95% quantile of a single batch's ECE under no drift (estimated
on separate null batches), i.e. 5% false alarms at one look. Its false-alarm
rate grows with the number of looks; the e-process's does not exceed alpha.

Segments (``--segment-streams``, 1,000 by default): each batch's labels fall
in ``--segments`` segments of one dimension, the first carrying
``--segment-share`` of the traffic (200 of 2,000 labels) and the others equal
parts of the rest (95 or 90 labels), a fixed split per batch. From batch
``--change`` the first segment drifts by a logit shift of ``--segment-shift``
(0.6); the others stay calibrated. Every segment has a drift test with alpha split
over declared capacity, the earlier design (``segment_alpha``: one dimension
of max_values = ``--segments``, so alpha / (segments + 1) per test);
``benchmarks/segment_drift.py`` compares it with the service's shared budget. Reported: the drifted
segment's power and delay, false alarms of the calibrated segments, and the
global test (all labels, alpha) on the same streams; under no drift anywhere,
the share of streams where any segment test alarms (the family-wise rate, at
most alpha by the union bound). Run at the 5% base rate and at a 30% one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibd.metrics import ece  # noqa: E402
from calibd.monitoring import ParallelDriftTests  # noqa: E402
from calibd.monitoring.segments import segment_alpha  # noqa: E402

N_BINS = 15
LOOKS = (1, 2, 4, 8, 16, 24)


def mean_logit_for_rate(rate: float) -> float:
    """mu with E[sigmoid(mu + Z)] = rate, Z standard normal, by Gauss-Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    return brentq(lambda mu: weights @ expit(mu + nodes) - rate, -30.0, 30.0)


def offset_for_rate(rate: float, mu: float, slope: float = 1.0) -> float:
    """b with E[sigmoid(mu + slope * Z + b)] = rate: the intercept that keeps a base rate."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    return brentq(lambda b: weights @ expit(mu + slope * nodes + b) - rate, -30.0, 30.0)


@dataclass
class Scenario:
    name: str
    true_logit: Callable[[np.ndarray], np.ndarray]  # eta from z after the change
    change: int | None  # first drifted batch, 0-based; None: no drift
    null_at: tuple[float, ...] = ()  # tolerances under which this scenario is in the null
    alarm_batches: dict = field(default_factory=dict)  # tolerance -> (streams,) 1-based, 0 = none
    ece: np.ndarray | None = None  # (streams, batches) naive monitor's statistic
    seconds: float = 0.0


def scenarios(mu: float, base_rate: float, change: int, tolerance: float) -> list[Scenario]:
    slope_up = offset_for_rate(base_rate, mu, 1.4)
    slope_down = offset_for_rate(base_rate, mu, 0.7)
    rate_shift = offset_for_rate(0.07, mu)
    return [
        Scenario("no drift", lambda z: z, change=None, null_at=(0.0, tolerance)),
        Scenario(f"logit shift +{tolerance:g} throughout (on the tolerance edge)", lambda z: z + tolerance,
                 change=0, null_at=(tolerance,)),
        Scenario("logit shift +0.4", lambda z: z + 0.4, change=change),
        Scenario("logit shift -0.4", lambda z: z - 0.4, change=change),
        Scenario("slope 1.4 (base rate kept)", lambda z: mu + 1.4 * (z - mu) + slope_up, change=change),
        Scenario("slope 0.7 (base rate kept)", lambda z: mu + 0.7 * (z - mu) + slope_down, change=change),
        Scenario(f"base rate {base_rate:.0%} -> 7% (logit {rate_shift:+.3f})", lambda z: z + rate_shift, change=change),
    ]


def batch_ece(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """15-bin equal-width ECE of each row, bins [k/15, (k+1)/15) with 1.0 in the last (as calibd.metrics.ece)."""
    m, n = p.shape
    bins = np.clip(np.searchsorted(np.linspace(0.0, 1.0, N_BINS + 1), p, side="right") - 1, 0, N_BINS - 1)
    index = (bins + N_BINS * np.arange(m)[:, None]).ravel()
    gap = np.bincount(index, weights=(y - p).ravel(), minlength=m * N_BINS).reshape(m, N_BINS)
    return np.abs(gap).sum(axis=1) / n


def run_chunk(scenario: Scenario, seed: np.random.SeedSequence, n_streams: int, args, mu: float):
    rng = np.random.default_rng(seed)
    tests = {tol: ParallelDriftTests(n_streams, alpha=args.alpha, tolerance=tol) for tol in (0.0, args.tolerance)}
    ece_values = np.empty((n_streams, args.batches))
    for batch in range(args.batches):
        z = rng.normal(mu, 1.0, (n_streams, args.labels))
        drifted = scenario.change is not None and batch >= scenario.change
        eta = scenario.true_logit(z) if drifted else z
        y = (rng.random(z.shape) < expit(eta)).astype(np.float64)
        p = expit(z)
        alarm_batch = {tol: test.update(p, y).alarm_batch for tol, test in tests.items()}
        ece_values[:, batch] = batch_ece(p, y)
    return alarm_batch, ece_values


def run_scenario(scenario: Scenario, index: int, args, mu: float) -> None:
    start = time.perf_counter()
    sizes = [min(args.chunk, args.streams - s) for s in range(0, args.streams, args.chunk)]
    seeds = np.random.SeedSequence([args.seed, index]).spawn(len(sizes))
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        parts = list(pool.map(lambda job: run_chunk(scenario, job[0], job[1], args, mu), zip(seeds, sizes)))
    scenario.alarm_batches = {tol: np.concatenate([part[0][tol] for part in parts]) for tol in parts[0][0]}
    scenario.ece = np.concatenate([part[1] for part in parts])
    scenario.seconds = time.perf_counter() - start


def naive_threshold(args, mu: float) -> float:
    """95% quantile of one batch's ECE under no drift, from separate null batches."""
    rng = np.random.default_rng([args.seed, 10_000])
    values = []
    for _ in range(0, args.naive_calibration, 1000):
        z = rng.normal(mu, 1.0, (1000, args.labels))
        p = expit(z)
        y = (rng.random(z.shape) < p).astype(np.float64)
        values.append(batch_ece(p, y))
        # The vectorised ECE is the service's ECE.
        assert abs(values[-1][0] - ece(p[0], y[0], n_bins=N_BINS)) <= 1e-12 * max(1.0, values[-1][0])
    return float(np.quantile(np.concatenate(values), 1.0 - args.alpha))


def segment_sizes(labels: int, n_segments: int, share: float) -> list[int]:
    """Labels per segment in a batch: the first carries ``share``, the others split the rest as evenly as integers allow."""
    first = int(round(share * labels))
    rest = labels - first
    base, extra = divmod(rest, n_segments - 1)
    return [first] + [base + (1 if j < extra else 0) for j in range(n_segments - 1)][::-1]


def run_segment_chunk(seed: np.random.SeedSequence, n_streams: int, args, mu: float, shift: float):
    """One chunk of streams: the alarm batch of every segment test (segments, streams) and of the global test."""
    rng = np.random.default_rng(seed)
    sizes = segment_sizes(args.labels, args.segments, args.segment_share)
    edges = np.cumsum([0] + sizes)
    share = segment_alpha(args.alpha, 1, args.segments)
    tests = [ParallelDriftTests(n_streams, alpha=share, tolerance=args.tolerance) for _ in sizes]
    overall = ParallelDriftTests(n_streams, alpha=args.alpha, tolerance=args.tolerance)
    for batch in range(args.batches):
        z = rng.normal(mu, 1.0, (n_streams, args.labels))
        eta = z.copy()
        if shift and batch >= args.change:
            eta[:, : sizes[0]] += shift  # the first segment's labels
        y = (rng.random(z.shape) < expit(eta)).astype(np.float64)
        p = expit(z)
        for j, test in enumerate(tests):
            test.update(p[:, edges[j] : edges[j + 1]], y[:, edges[j] : edges[j + 1]])
        overall.update(p, y)
    return np.stack([t._state.alarm_batch for t in tests]), overall._state.alarm_batch.copy()


def segment_simulation(args) -> tuple[list[str], list[dict]]:
    """Rows of the segment table, and their records."""
    rows, records = [], []
    for base_rate in (args.base_rate, 0.3):
        mu = mean_logit_for_rate(base_rate)
        for shift in (args.segment_shift, 0.0):
            start = time.perf_counter()
            sizes = [min(args.chunk, args.segment_streams - s) for s in range(0, args.segment_streams, args.chunk)]
            seeds = np.random.SeedSequence([args.seed, 20_000, int(base_rate * 1000), int(shift * 1000)]).spawn(len(sizes))
            with ThreadPoolExecutor(max_workers=args.workers) as pool:
                parts = list(pool.map(lambda job: run_segment_chunk(job[0], job[1], args, mu, shift), zip(seeds, sizes)))
            segment_alarms = np.concatenate([part[0] for part in parts], axis=1)  # (segments, streams)
            global_alarms = np.concatenate([part[1] for part in parts])
            seconds = time.perf_counter() - start
            drifted = segment_alarms[0]
            calm = segment_alarms[1:] if shift else segment_alarms
            any_calm = (calm > 0).any(axis=0).mean()
            if shift:
                seg = summarise(drifted, args.change, False)
                glob = summarise(global_alarms, args.change, False)
            else:
                seg = glob = None
            record = {
                "monitor": "segments", "base_rate": base_rate, "shift": shift, "streams": args.segment_streams,
                "segments": args.segments, "alpha_per_segment": segment_alpha(args.alpha, 1, args.segments),
                "segment": seg, "global": glob if shift else summarise(global_alarms, None, True),
                "any_calibrated_segment_alarm": float(any_calm), "seconds": seconds,
            }
            records.append(record)
            print(f"# segments, base rate {base_rate:.0%}, shift {shift:g}: {seconds:.1f} s", file=sys.stderr, flush=True)
            if shift:
                rows.append(
                    f"| {base_rate:.0%} | +{shift:g} in one segment (10%) | {fmt(seg['detected'])} | "
                    f"{fmt(seg['median'], 'n')} | {fmt(seg['p90'], 'n')} | {fmt(seg['before'])} | {fmt(any_calm)} | "
                    f"{fmt(glob['detected'])} | {fmt(glob['median'], 'n')} |"
                )
            else:
                rows.append(
                    f"| {base_rate:.0%} | none | — | — | — | — | {fmt(any_calm)} | "
                    f"{fmt(record['global']['ever'])} (false) | — |"
                )
    return rows, records


def expected_kl(mu: float, shift: float, tolerance: float) -> float:
    """E_z KL(Bernoulli(sigmoid(z + shift)) || Bernoulli(sigmoid(z + tolerance))), z ~ Normal(mu, 1): nats per label."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    q, r = expit(mu + nodes + shift), expit(mu + nodes + tolerance)
    return float(weights @ (q * np.log(q / r) + (1 - q) * np.log((1 - q) / (1 - r))))


def summarise(alarm_batch: np.ndarray, change: int | None, in_null: bool) -> dict:
    alarmed = alarm_batch > 0
    out = {"ever": float(alarmed.mean())}
    if in_null or change is None:
        out.update(before=float(alarmed.mean()), detected=None, median=None, p90=None)
        return out
    before = alarmed & (alarm_batch <= change)
    after = alarm_batch > change
    delay = alarm_batch[after] - change
    out.update(
        before=float(before.mean()),
        detected=float(after.mean()),
        median=float(np.median(delay)) if delay.size else None,
        p90=float(np.quantile(delay, 0.9, method="inverted_cdf")) if delay.size else None,
    )
    return out


def fmt(value, kind="share"):
    if value is None:
        return "—"
    if kind == "share":
        return f"{100 * value:.2f}%"
    return f"{value:g}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--labels", type=int, default=2000, help="labels per batch")
    parser.add_argument("--change", type=int, default=8, help="first drifted batch, 0-based")
    parser.add_argument("--base-rate", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--tolerance", type=float, default=0.1, help="the service tolerance, besides 0")
    parser.add_argument("--naive-calibration", type=int, default=20_000, help="null batches for the ECE threshold")
    parser.add_argument("--chunk", type=int, default=250,
                        help="streams per work unit, each with its own random stream (keep it fixed to reproduce)")
    parser.add_argument("--workers", type=int, default=1, help="threads (numpy releases the GIL)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="run only scenarios whose name contains this ('segments': those)")
    parser.add_argument("--segment-streams", type=int, default=1000, help="streams of the segment simulation (0: skip)")
    parser.add_argument("--segments", type=int, default=20)
    parser.add_argument("--segment-share", type=float, default=0.1, help="traffic of the drifted segment")
    parser.add_argument("--segment-shift", type=float, default=0.6, help="logit shift of the drifted segment")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)

    total = time.perf_counter()
    mu = mean_logit_for_rate(args.base_rate)
    threshold = naive_threshold(args, mu)
    tolerances = (0.0, args.tolerance)
    rows, naive_rows, records, look_rows = [], [], [], None
    all_scenarios = scenarios(mu, args.base_rate, args.change, args.tolerance)
    for index, scenario in enumerate(all_scenarios):
        if args.only and args.only not in scenario.name:
            scenario.alarm_batches = {}
            continue
        run_scenario(scenario, index, args, mu)
        print(f"# {scenario.name}: {scenario.seconds:.1f} s", file=sys.stderr, flush=True)
        for tol in tolerances:
            in_null = tol in scenario.null_at
            stats = summarise(scenario.alarm_batches[tol], scenario.change, in_null)
            records.append({"scenario": scenario.name, "tolerance": tol, "null": in_null, **stats,
                            "seconds": scenario.seconds})
            rows.append(
                f"| {scenario.name} | {tol:g} | {'yes' if in_null else 'no'} | {fmt(stats['ever'])} | "
                f"{fmt(stats['before'])} | {fmt(stats['detected'])} | {fmt(stats['median'], 'n')} | "
                f"{fmt(stats['p90'], 'n')} |"
            )
        exceed = scenario.ece > threshold
        first = np.where(exceed.any(axis=1), exceed.argmax(axis=1) + 1, 0)
        naive = summarise(first, scenario.change, scenario.change is None)
        naive_rows.append(
            f"| {scenario.name} | {fmt(naive['ever'])} | {fmt(naive['before'])} | {fmt(naive['detected'])} | "
            f"{fmt(naive['median'], 'n')} |"
        )
        records.append({"scenario": scenario.name, "monitor": "naive_ece", **naive})
        if scenario.change is None:
            looks = [t for t in LOOKS if t <= args.batches]
            look_rows = [
                ("naive ECE > threshold", [exceed[:, :t].any(axis=1).mean() for t in looks]),
                *[
                    (f"e-process, tolerance {tol:g}",
                     [((scenario.alarm_batches[tol] > 0) & (scenario.alarm_batches[tol] <= t)).mean() for t in looks])
                    for tol in tolerances
                ],
            ]
    segment_rows, segment_records = [], []
    if args.segment_streams and (not args.only or args.only == "segments"):
        segment_rows, segment_records = segment_simulation(args)
        records += segment_records
    elapsed = time.perf_counter() - total

    print(f"\n## Drift test (alpha = {args.alpha:g}): {args.streams} streams x {args.batches} batches x "
          f"{args.labels} labels, base rate {args.base_rate:.0%}, drift from batch {args.change + 1}\n")
    print("| scenario | tolerance | in the null | ever alarmed | alarmed before the change | detected after it "
          "| median delay | 90% delay |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if look_rows:
        print("\n## False alarms under no drift by number of looks (batches)\n")
        print("| monitor | " + " | ".join(f"{t} look{'s' if t > 1 else ''}" for t in looks) + " |")
        print("|---|" + "---|" * len(looks))
        for name, values in look_rows:
            print(f"| {name} | " + " | ".join(fmt(v) for v in values) + " |")
    print(f"\n## Naive monitor: batch ECE ({N_BINS} equal-width bins) > {threshold:.5f} at every look "
          f"(5% false alarms at one look)\n")
    print("| scenario | ever alarmed | alarmed before the change | detected after it | median delay |")
    print("|---|---|---|---|---|")
    print("\n".join(naive_rows))
    if segment_rows:
        sizes = segment_sizes(args.labels, args.segments, args.segment_share)
        print(f"\n## Per-segment drift tests: {args.segment_streams} streams x {args.batches} batches x {args.labels} labels, "
              f"{args.segments} segments ({sizes[0]} labels of a batch in the drifted one, {min(sizes[1:])}-{max(sizes[1:])} in each "
              f"other), drift from batch {args.change + 1}, tolerance {args.tolerance:g}\n")
        print(f"Each segment test has alpha / (max_values + 1) = {args.alpha:g} / {args.segments + 1} = "
              f"{segment_alpha(args.alpha, 1, args.segments):.5f} (one dimension, max_values = {args.segments}); the global "
              f"test has alpha = {args.alpha:g} on all labels. Targets: the drifted segment's alarm detects >= 95% of "
              f"streams with a median delay <= 3 batches; with no drift, at most alpha of streams raise any segment alarm.\n")
        print("| base rate | drift | segment alarm: detected | median delay | 90% delay | alarmed before the change "
              "| any calibrated segment alarmed | global alarm: detected | global median delay |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(segment_rows))
        share = segment_alpha(args.alpha, 1, args.segments)
        for base_rate in (args.base_rate, 0.3):
            per_batch = sizes[0] * expected_kl(mean_logit_for_rate(base_rate), args.segment_shift, args.tolerance)
            print(f"\nBase rate {base_rate:.0%}: a drifted batch of the segment carries {per_batch:.2f} nats of evidence "
                  f"beyond the tolerance (expected KL of the shifted labels from the nearest null), so even an oracle "
                  f"test told the shift and its start needs log(1/{share:.5f}) / {per_batch:.2f} = "
                  f"{np.log(1 / share) / per_batch:.1f} batches on average.", end="")
        print()
    per = ", ".join(f"{s.name}: {s.seconds:.0f} s" for s in all_scenarios if s.seconds)
    print(f"\nRuntime {elapsed:.0f} s in all, {args.workers} worker thread(s) ({per}).")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "ece_threshold": threshold, "seconds": elapsed, "results": records},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
