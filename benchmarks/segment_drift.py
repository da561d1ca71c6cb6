"""Segment drift tests compared: delay against the information limit, and the family-wise false-alarm rate.

    .venv/bin/python benchmarks/segment_drift.py                # 1,000 streams a scenario, some minutes
    .venv/bin/python benchmarks/segment_drift.py --streams 200  # a quick look

A calibrator version's labels fall into the segments of one dimension, a fixed
number of labels of each segment per batch. Predictions are p = sigmoid(z),
z ~ Normal(mu, 1), mu set for the base rate; labels are drawn from
sigmoid(z) (calibrated), and from the change on, in the drifted segment, from
sigmoid(z + shift). Every design runs at alpha = 0.05 and tolerance 0.1 on the
same data:

* ``split``: each segment its own ``DriftTest`` (start prior on its own labels,
  42 experts) at alpha / (max_values + 1), the split over declared capacity;
* ``budget``: one start prior over the version's labels, each label's start
  mass to its segment (``calibd.monitoring.segment_drift``), the fine mixture,
  threshold log(1/alpha) for every segment (the service's design);
* ``budget, shifts 0.1-2.5 only``: the same budget, logit-shift experts only on
  a narrower grid (chosen on other seeds);
* ``known shift, unknown start``: the budget with the drift's own shift as the
  only expert: what not knowing the start costs;
* ``known start, unknown shift``: the service's experts, all the start mass on
  the first drifted batch, threshold log(1/alpha_j): what not knowing the
  shift costs;
* ``oracle, simulated``: the drift's own shift, told its start, log(1/alpha_j).

The no-drift runs (the service's design by default) include a stream that
breaks the easy cases: 50 segments with Zipf shares, a log-normal batch size,
base rates from 1% to 40%, every label on the edge of the null (+-0.1).

The oracle column knows the shift and its start (an expected delay, without
overshoot): log(1/alpha_j) / KL nats per batch, alpha_j = alpha / (max_values + 1),
KL the expected evidence of one drifted batch of the segment beyond the tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibd.monitoring.drift import RESTART_POWER, Experts, ParallelDriftTests  # noqa: E402
from calibd.monitoring.segment_drift import FAMILY_SCALE, ParallelSegmentDriftTests, start_mass  # noqa: E402
from calibd.monitoring.segments import segment_alpha  # noqa: E402
from monitor_sim import expected_kl, mean_logit_for_rate  # noqa: E402

ALPHA, TOLERANCE = 0.05, 0.1
ORACLE = "oracle, simulated: shift and start known"
KNOWN_SHIFT, KNOWN_START = "known shift, unknown start", "known start, unknown shift"
DESIGNS = ("split", "budget", "budget, shifts 0.1-2.5 only", KNOWN_SHIFT, KNOWN_START, ORACLE)
#: Designs whose experts replace the segment test's own (shift sizes beyond the band, weights shared
#: equally); None: the one expert of the drift's own shift and sign.
EXPERT_GRIDS = {"budget, shifts 0.1-2.5 only": np.geomspace(0.1, 2.5, 30), KNOWN_SHIFT: None, ORACLE: None}
#: Designs told the change: alpha / (segments + 1) and all the start mass on the first drifted batch.
TOLD_START = (KNOWN_START, ORACLE)


def shift_only_experts(shifts, known_shift: float) -> Experts:
    """Logit-shift experts only, both signs, equal weights; ``shifts=None``: the drift's own shift alone.

    The slope and plug-in experts stay in the array (same state shape) with weight zero.
    """
    if shifts is None:
        shifts = np.array([known_shift - TOLERANCE])
    experts = Experts.build(TOLERANCE, 2000.0, np.asarray(shifts, dtype=np.float64), (1.0, 0.5, 0.5))
    weight = np.full(experts.size, -np.inf)
    k = 1 if len(shifts) == 1 and known_shift > 0 else experts.n_shifts
    weight[:k] = -math.log(k)
    return dataclasses.replace(experts, log_weight=weight)


class Design:
    """One segment's test under a design, for m streams; ``step`` returns the alarm batch so far."""

    def __init__(self, name: str, m: int, n_segments: int, share: float, family_scale: float,
                 known_shift: float = 0.6):
        self.name, self.share, self.scale = name, share, family_scale
        self.alpha_split = segment_alpha(ALPHA, 1, n_segments)
        if name == "split":
            self.test = ParallelDriftTests(m, alpha=self.alpha_split, tolerance=TOLERANCE)
        else:
            alpha = self.alpha_split if name in ("split+mixture", *TOLD_START) else ALPHA
            self.test = ParallelSegmentDriftTests(m, alpha=alpha, tolerance=TOLERANCE)
            if name == "budget, 42 experts":
                self.test._experts = Experts.build(TOLERANCE, 2000.0)
                self.test._state.log_s = np.full((m, self.test._experts.size), -np.inf)
            if name in EXPERT_GRIDS:
                self.test._experts = shift_only_experts(EXPERT_GRIDS[name], known_shift)
                self.test._state.log_s = np.full((m, self.test._experts.size), -np.inf)
        self.given = 0.0  # family budget given out (budget designs)
        self.own = 0  # the segment's own labels (split+mixture's start prior)
        self.batch, self.change = 0, None  # told-start designs

    def mass(self, n_batch: int, n_segment: int) -> float:
        if self.name in TOLD_START:
            self.batch += 1
            return 1.0 if self.batch == self.change + 1 else 0.0
        if self.name == "split+mixture":  # the global test's start prior, on the segment's own labels
            g = lambda n: (1.0 + n / 2000.0) ** -RESTART_POWER  # noqa: E731
            w = g(self.own) - g(self.own + n_segment)
            self.own += n_segment
            return w
        w = start_mass(self.given, n_batch, self.scale)
        self.given += w
        return w * n_segment / n_batch

    def step(self, p, y, n_batch):
        if self.name == "split":
            return self.test.update(p, y).alarm_batch
        return self.test.update(p, y, self.mass(n_batch, p.shape[1])).alarm_batch


def run(design: str, m: int, rng, sizes: list[int], mu: float, shift: float, change: int | None, batches: int,
        scale: float, segments: list[int]) -> np.ndarray:
    """Alarm batch (0: none) of each simulated segment (len(segments), m)."""
    n_batch = sum(sizes)
    tests = [Design(design, m, len(sizes), sizes[j] / n_batch, scale, shift) for j in segments]
    for test in tests:
        test.change = change
    for batch in range(batches):
        for test, j in zip(tests, segments):
            z = rng.normal(mu, 1.0, (m, sizes[j]))
            eta = z + shift if (j == 0 and change is not None and batch >= change) else z
            y = (rng.random(z.shape) < expit(eta)).astype(np.float64)
            out = test.step(expit(z), y, n_batch)
        del out
    return np.stack([t.test._state.alarm_batch for t in tests])


def summary(alarm: np.ndarray, change: int) -> dict:
    after = alarm > change
    delay = alarm[after] - change
    return {
        "detected": float(after.mean()), "before": float(((alarm > 0) & (alarm <= change)).mean()),
        "median": float(np.median(delay)) if delay.size else None,
        "mean": float(delay.mean()) if delay.size else None,
        "p90": float(np.quantile(delay, 0.9, method="inverted_cdf")) if delay.size else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--null-streams", type=int, default=1000, help="streams of the family-wise runs (20 segments)")
    parser.add_argument("--null-streams-100", type=int, default=200, help="streams of the family-wise run at 100 segments")
    parser.add_argument("--designs", default=";".join(DESIGNS), help="names separated by ;")
    parser.add_argument("--null-designs", default="budget", help="designs of the no-drift runs, separated by ;")
    parser.add_argument("--scale", type=float, default=FAMILY_SCALE, help="family start prior scale, labels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "segment_drift.md",
                        help="the RESULTS.md section written")
    parser.add_argument("--cpu", action="store_true", help="only the CPU cost per feedback batch")
    args = parser.parse_args(argv)
    if args.cpu:
        print("| design | segments | labels each | CPU ms per feedback batch (median) | ratio to today |")
        print("|---|---|---|---|---|")
        print("\n".join(cpu_per_batch()))
        return 0
    designs = args.designs.split(";")
    t0 = time.perf_counter()
    load = os.getloadavg()[0]

    twenty = [200] + [95] * 10 + [94] * 9  # 2,000 labels: 10% in the drifted segment
    hundred = [100] * 100  # 10,000 labels: 1% each
    cases = [
        # name, sizes, base rate, change, batches
        ("20 segments, 5%, change after 8", twenty, 0.05, 8, 30),
        ("20 segments, 5%, change after 50", twenty, 0.05, 50, 72),
        ("20 segments, 30%, change after 8", twenty, 0.30, 8, 20),
        ("100 segments of 1%, 5%, change after 8", hundred, 0.05, 8, 60),
    ]
    rows, records = [], []
    for index, (name, sizes, rate, change, batches) in enumerate(cases):
        mu = mean_logit_for_rate(rate)
        kl = sizes[0] * expected_kl(mu, 0.6, TOLERANCE)
        oracle = math.log((len(sizes) + 1) / ALPHA) / kl
        for design in designs:
            start = time.perf_counter()
            rng = np.random.default_rng([args.seed, index])
            alarm = run(design, args.streams, rng, sizes, mu, 0.6, change, batches, args.scale, [0])[0]
            s = summary(alarm, change)
            records.append({"case": name, "design": design, "oracle": oracle, "kl_per_batch": kl, **s,
                            "seconds": time.perf_counter() - start})
            rows.append(f"| {name} | {design} | {s['detected']:.1%} | {s['median']:g} | {s['p90']:g} | "
                        f"{s['mean']:.2f} | {oracle:.1f} | {s['median'] / oracle:.2f} | {s['before']:.2%} |")
            print(rows[-1], file=sys.stderr, flush=True)
    null_rows = []
    null_designs = args.null_designs.split(";")
    sizes_of, mus, edges = heavy_tailed(args.seed)
    for design in null_designs:
        start = time.perf_counter()
        rng = np.random.default_rng([args.seed, 98])
        alarms = run_null_varying(design, args.null_streams, rng, sizes_of, mus, edges, 30, args.scale)
        fwer = float((alarms > 0).any(axis=0).mean())
        name = "50 segments, Zipf sizes, batch size log-normal, base rates 1-40%, every label at +-0.1 (the edge)"
        records.append({"case": name, "design": design, "family_wise": fwer, "streams": args.null_streams,
                        "seconds": time.perf_counter() - start})
        null_rows.append(f"| {name} | {design} | {args.null_streams} | {fwer:.2%} |")
        print(null_rows[-1], file=sys.stderr, flush=True)
    for name, sizes, rate, batches, m, edge in (
        ("20 segments, 5%, calibrated", twenty, 0.05, 30, args.null_streams, 0.0),
        ("20 segments, 5%, every segment at +0.1 (the null's edge)", twenty, 0.05, 30, args.null_streams, TOLERANCE),
        ("100 segments of 1%, 5%, calibrated", hundred, 0.05, 60, args.null_streams_100, 0.0),
    ):
        mu = mean_logit_for_rate(rate)
        for design in null_designs:
            start = time.perf_counter()
            rng = np.random.default_rng([args.seed, 99, len(sizes), int(edge * 10)])
            # The null's edge: every label drawn at logit z + 0.1 (shift applied through the drift path for all).
            alarms = run_null(design, m, rng, sizes, mu, edge, batches, args.scale)
            fwer = float((alarms > 0).any(axis=0).mean())
            records.append({"case": name, "design": design, "family_wise": fwer, "streams": m,
                            "seconds": time.perf_counter() - start})
            null_rows.append(f"| {name} | {design} | {m} | {fwer:.2%} |")
            print(null_rows[-1], file=sys.stderr, flush=True)

    lines: list[str] = []

    def emit(*parts, **_):
        lines.append(" ".join(str(x) for x in parts))

    emit(f"\n## Segment drift tests: designs against the oracle ({args.streams} streams a case, alpha {ALPHA}, "
          f"tolerance {TOLERANCE}, shift +0.6 in the first segment)\n")
    emit(f"Load average {load:.1f} at start; family start prior scale {args.scale:g} labels.\n")
    emit("| case | design | detected | median delay | 90% delay | mean delay | oracle | median / oracle "
         "| alarmed before |")
    emit("|---|---|---|---|---|---|---|---|---|")
    emit("\n".join(rows))
    emit("\n## Family-wise false alarms, no drift (any segment ever alarmed)\n")
    emit("| case | design | streams | family-wise rate |")
    emit("|---|---|---|---|")
    emit("\n".join(null_rows))
    emit("\n## CPU per feedback batch of the segment tests (load, update, save each segment's state)\n")
    emit("| design | segments | labels each | CPU ms per feedback batch (median) | ratio to today |")
    emit("|---|---|---|---|---|")
    emit("\n".join(cpu_per_batch()))
    emit(f"\nRuntime {time.perf_counter() - t0:.0f} s.")
    text = "\n".join(lines).strip() + "\n"
    print(text)
    args.out.write_text(text)
    from report import assemble
    assemble()
    if args.json:
        args.json.write_text(json.dumps({"load": load, "scale": args.scale, "results": records}, indent=1))
    return 0


def cpu_per_batch(repeats: int = 5, n_segments: int = 100, n: int = 100) -> list[str]:
    """CPU seconds per feedback batch of the segment tests as storage runs them: load, update, save, per segment."""
    rng = np.random.default_rng(1)
    from calibd.monitoring.drift import DriftTest
    from calibd.monitoring.segment_drift import SegmentDriftTest

    p = rng.uniform(0.01, 0.2, (n_segments, n))
    y = (rng.uniform(size=p.shape) < p).astype(np.int8)
    old = [DriftTest(alpha=ALPHA / (n_segments + 1), tolerance=TOLERANCE) for _ in range(n_segments)]
    new = [SegmentDriftTest(alpha=ALPHA, tolerance=TOLERANCE) for _ in range(n_segments)]
    for j in range(n_segments):  # a stored state with history, as after some batches
        old[j].update(p[j], y[j])
        new[j].update(p[j], y[j], 1e-4)
    saved = {"split (today)": [t.to_dict() for t in old], "budget": [t.to_dict() for t in new]}
    times = {}
    for _ in range(repeats):
        for name, cls in (("split (today)", DriftTest), ("budget", SegmentDriftTest)):
            start = time.process_time()
            for j in range(n_segments):
                test = cls.from_dict(json.loads(json.dumps(saved[name][j])))
                test.update(p[j], y[j]) if cls is DriftTest else test.update(p[j], y[j], 1e-4)
                json.dumps(test.to_dict())
            times.setdefault(name, []).append(time.process_time() - start)
    base = float(np.median(times["split (today)"]))
    return [f"| {name} | {n_segments} | {n} | {1000 * float(np.median(t)):.1f} | {float(np.median(t)) / base:.2f} |"
            for name, t in times.items()]


def run_null(design, m, rng, sizes, mu, edge, batches, scale):
    """Alarm batches (segments, m) with no drift: fixed segment sizes, every label at logit z + edge."""
    n = len(sizes)
    return run_null_varying(design, m, rng, lambda batch: list(sizes), np.full(n, mu), np.full(n, edge), batches, scale)


def run_null_varying(design, m, rng, sizes_of, mus, edges, batches, scale):
    """``run_null`` with the batch's segment sizes from ``sizes_of(batch)`` and each segment's own mu and edge.

    A segment without labels in a batch is not updated and gets no start mass, as in the service.
    """
    first = sizes_of(0)
    n_segments = len(first)
    tests = [Design(design, m, n_segments, 1.0 / n_segments, scale) for _ in range(n_segments)]
    given = 0.0  # one family budget for the budget designs
    for batch in range(batches):
        sizes = first if batch == 0 else sizes_of(batch)
        n_batch = int(sum(sizes))
        w = start_mass(given, n_batch, scale)
        given += w
        for j, (test, size) in enumerate(zip(tests, sizes)):
            if size == 0:
                continue
            z = rng.normal(mus[j], 1.0, (m, size))
            y = (rng.random(z.shape) < expit(z + edges[j])).astype(np.float64)
            if test.name.startswith("budget") or test.name.startswith("known"):
                test.test.update(expit(z), y, w * size / n_batch)
            else:
                test.step(expit(z), y, n_batch)
    return np.stack([t.test._state.alarm_batch for t in tests])


def heavy_tailed(seed: int, n_segments: int = 50):
    """Zipf segment shares (1/k^1.1), a log-normal batch size around 2,000, base rates 1% to 40%, edges +-0.1.

    Sizes are drawn per batch and shared by the streams (so streams can be vectorised); labels and
    predictions are drawn per stream.
    """
    draw = np.random.default_rng([seed, 7])
    share = 1.0 / np.arange(1, n_segments + 1) ** 1.1
    share /= share.sum()
    rates = np.geomspace(0.01, 0.4, n_segments)[draw.permutation(n_segments)]
    mus = np.array([mean_logit_for_rate(r) for r in rates])
    edges = np.where(np.arange(n_segments) % 2 == 0, TOLERANCE, -TOLERANCE)

    def sizes_of(batch):
        total = int(2000 * math.exp(draw.normal(0.0, 0.7)))
        return [int(v) for v in draw.multinomial(max(total, 1), share)]

    return sizes_of, mus, edges


if __name__ == "__main__":
    raise SystemExit(main())
