"""Label timing: false alarms and detection delay of the drift alarms when a label's delay depends on its value.

    .venv/bin/python benchmarks/label_delay.py                 # 500 streams a case, some minutes
    .venv/bin/python benchmarks/label_delay.py --streams 100   # a quick look

Each stream serves a batch of 1,000 predictions per step (p = sigmoid(z),
z ~ Normal(mu, 1), a 30% base rate by default); a label is drawn from sigmoid(z), or after
the change (step 9) from the shifted truth. Its arrival step depends on its
value:

* immediate: every label at the step of its prediction;
* positives first: positives at once, negatives at the end of a window of W steps (clicks, conversions);
* mixed: positives 0 or 1 step late, negatives 1 to W steps late (uniform).

The monitors are the service's pure core (``DriftTest`` for the global alarm,
``SegmentDriftTest`` with the family's start mass for the segments), fed as
the service feeds them:

* with a window declared: at step s, the predictions of step s - W, mature now,
  in prediction-time order (a label that came early waited; a negative not
  yet sent would be implied, here every label comes inside the window);
* with no window (labels final on arrival): at step s, the labels that
  arrived at step s, in arrival order.

Global: every label shifts by +0.4 logit. Segments: 20 segments, the first with
10% of each batch (100 labels), the others 47 or 48; the first shifts by +0.6.
Delay: steps from the first shifted prediction to the alarm (1 = at once).
The issue's claim checked: with a window, delay <= W + 1.5 x the delay with
immediate labels (medians, on the same streams).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibd.monitoring import DriftTest, ParallelDriftTests  # noqa: E402
from calibd.monitoring.segment_drift import ParallelSegmentDriftTests, SegmentDriftTest, start_mass  # noqa: E402
from monitor_sim import mean_logit_for_rate  # noqa: E402

ALPHA, TOLERANCE, N, CHANGE = 0.05, 0.1, 1000, 8
SIZES = [100] + [48] * 7 + [47] * 12
EDGES = np.cumsum([0] + SIZES)


def delays(rng, y: np.ndarray, mix: str, window: int) -> np.ndarray:
    """Arrival delay (steps) of each label."""
    if mix == "immediate":
        return np.zeros(y.shape, dtype=int)
    if mix == "positives first":
        return np.where(y == 1, 0, window)
    return np.where(y == 1, rng.integers(0, 2, y.shape), rng.integers(1, window + 1, y.shape))


def simulate(rng, m: int, steps: int, mu: float, scope: str, shift: float):
    """Predictions and labels (m, steps, N)."""
    z = rng.normal(mu, 1.0, (m, steps, N))
    eta = z.copy()
    if shift:
        cols = slice(None) if scope == "global" else slice(0, SIZES[0])
        eta[:, CHANGE:, cols] += shift
    y = (rng.random(z.shape) < expit(eta)).astype(np.int8)
    return expit(z), y


def run_case(p, y, arrival, order: str, window: int, scope: str):
    """Alarm step (1-based, 0 = none) per stream; segments: (20, m), the drifted segment first."""
    m, steps, _ = p.shape
    horizon = steps + window
    if order == "arrival":
        return run_arrival(p, y, arrival, horizon, scope)
    lag = 0 if order == "immediate" else window
    if scope == "global":
        test = ParallelDriftTests(m, alpha=ALPHA, tolerance=TOLERANCE)
        for s in range(lag, steps + lag):
            test.update(p[:, s - lag], y[:, s - lag])
        return np.where(test._state.alarm, test._state.alarm_batch + lag, 0)
    tests = [ParallelSegmentDriftTests(m, alpha=ALPHA, tolerance=TOLERANCE) for _ in SIZES]
    given = 0.0
    for s in range(lag, steps + lag):
        w = start_mass(given, N)
        given += w
        for j, test in enumerate(tests):
            cols = slice(EDGES[j], EDGES[j + 1])
            test.update(p[:, s - lag, cols], y[:, s - lag, cols], w * SIZES[j] / N)
    return np.stack([np.where(t._state.alarm, t._state.alarm_batch + lag, 0) for t in tests])


def run_arrival(p, y, arrival, horizon: int, scope: str):
    """No window: each stream's monitor fed, step by step, the labels that arrived (one stream at a time)."""
    m, steps, _ = p.shape
    out = np.zeros(m if scope == "global" else (1, m), dtype=np.int64)
    step_of = np.arange(steps)[:, None] + arrival  # (m, steps, N) arrival step
    for i in range(m):
        if scope == "global":
            test = DriftTest(alpha=ALPHA, tolerance=TOLERANCE)
            cols = slice(None)
        else:  # the drifted segment's test; its start mass by the labels of the step, as the service gives it
            test, given, cols = SegmentDriftTest(alpha=ALPHA, tolerance=TOLERANCE), 0.0, slice(0, SIZES[0])
        order = np.argsort(step_of[i].ravel(), kind="stable")
        flat_step = step_of[i].ravel()[order]
        flat_p, flat_y = p[i].ravel()[order], y[i].ravel()[order]
        in_seg = np.zeros((steps, N), dtype=bool)
        in_seg[:, cols] = True
        flat_seg = in_seg.ravel()[order]
        bounds = np.searchsorted(flat_step, np.arange(horizon + 1))
        for s in range(horizon):
            a, b = bounds[s], bounds[s + 1]
            if scope == "global":
                if b > a:
                    result = test.update(flat_p[a:b], flat_y[a:b])
            else:
                w = start_mass(given, b - a)
                given += w
                sel = flat_seg[a:b]
                if sel.any():
                    result = test.update(flat_p[a:b][sel], flat_y[a:b][sel], w * sel.sum() / (b - a))
            if result.alarm:
                (out if scope == "global" else out[0])[i] = s + 1
                break
    return out


def summary(first: np.ndarray, shifted: bool) -> dict:
    alarmed = first > 0
    if not shifted:
        return {"false": float(alarmed.mean()), "detected": None, "median": None}
    before = alarmed & (first <= CHANGE)
    after = first > CHANGE
    delay = first[after] - CHANGE
    return {"false": float(before.mean()), "detected": float(after.mean()),
            "median": float(np.median(delay)) if delay.size else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--base-rate", type=float, default=0.3)
    parser.add_argument("--window", type=int, default=3, help="label window, in steps")
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--scope", choices=("global", "segment"), default=None, help="one scope only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "label_delay.md")
    args = parser.parse_args(argv)
    t0, load = time.perf_counter(), os.getloadavg()[0]
    mu = mean_logit_for_rate(args.base_rate)
    cases = [("immediate", "immediate"), ("positives first", "window"), ("mixed", "window"),
             ("positives first", "arrival"), ("mixed", "arrival")]
    rows, medians = [], {}
    for scope, shift in (("global", 0.4), ("segment", 0.6)):
        if args.scope and scope != args.scope:
            continue
        immediate: dict[bool, np.ndarray] = {}
        for mix, order in cases:
            results = {}
            for shifted in (False, True):
                if order == "window":
                    # Every label arrives inside the window, so the monitor is fed the very batches it
                    # is fed with immediate labels, each W steps later: the same streams, shifted by W.
                    first = np.where(immediate[shifted] > 0, immediate[shifted] + args.window, 0)
                else:
                    parts = []
                    for c, start in enumerate(range(0, args.streams, args.chunk)):
                        m = min(args.chunk, args.streams - start)
                        rng = np.random.default_rng([args.seed, int(shifted), c, scope == "global"])
                        p, y = simulate(rng, m, args.steps, mu, scope, shift if shifted else 0.0)
                        arrival = delays(rng, y, mix, args.window)
                        parts.append(run_case(p, y, arrival, order, args.window, scope))
                    first = np.concatenate(parts, axis=-1)
                    if order == "immediate":
                        immediate[shifted] = first
                if scope == "segment":
                    # Null: any segment (family-wise; the arrival-order runs follow the first segment only).
                    null_first = np.where((first > 0).any(axis=0), 1, 0) if not shifted else first[0]
                    results[shifted] = summary(null_first if not shifted else first[0], shifted)
                    if shifted:
                        results["calm"] = float((first[1:] > 0).any(axis=0).mean()) if first.shape[0] > 1 else None
                else:
                    results[shifted] = summary(first, shifted)
            label = {"immediate": "immediate labels", "window": f"window of {args.window} declared",
                     "arrival": "no window (arrival order)"}[order]
            medians[(scope, mix, order)] = results[True]["median"]
            rows.append((scope, mix if order != "immediate" else "—", label, results))
            print(scope, mix, order, results, f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    lines = [
        "## Label timing: drift alarms when a label's delay depends on its value",
        "",
        f"x86_64, 2 cores, load average {load:.1f} at start. `benchmarks/label_delay.py`: {args.streams} streams a case, "
        f"{args.steps} steps of {N} predictions ({args.base_rate:.0%} base rate), alpha {ALPHA}, tolerance {TOLERANCE}, window {args.window} "
        f"steps; shift from step {CHANGE + 1}: +0.4 logit on every label (global), +0.6 in one segment of 20 with 10% of "
        "the traffic (segment). Positives first: positives at once, negatives at the window's end; mixed: positives "
        f"0-1 step late, negatives 1-{args.window}. False alarms: calibrated streams, alarms at any step (segments: any "
        "of the 20; in the arrival-order rows the first segment's alone); with a shift, also alarms before it.",
        "",
        "| alarm | delays | monitor fed | false alarms, calibrated | false alarms before the shift | detected | "
        "median delay (steps) | claim: <= W + 1.5 x immediate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scope, mix, label, r in rows:
        base = medians.get((scope, "immediate", "immediate"))
        med = r[True]["median"]
        claim = "—"
        if "window of" in label and med is not None and base is not None:
            bound = args.window + 1.5 * base
            claim = f"{med:g} <= {bound:g}: {'yes' if med <= bound else 'no'}"
        lines.append(
            f"| {scope} | {mix} | {label} | {r[False]['false']:.1%} | {r[True]['false']:.1%} | "
            f"{r[True]['detected']:.1%} | {'—' if med is None else f'{med:g}'} | {claim} |"
        )
    lines.append(f"\nRuntime {time.perf_counter() - t0:.0f} s.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out if not args.scope else args.out.with_name(f"{args.out.stem}_{args.scope}.part")
    out.write_text(text)
    if args.scope:
        return 0
    try:
        from report import assemble
        assemble()
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
