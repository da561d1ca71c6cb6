"""The first fit after a start against the second (target 32.4).

    .venv/bin/python benchmarks/first_fit.py [--starts 5] [--rows 2000]

Starts ``calibd serve`` ``--starts`` times (a fresh SQLite database each
time), waits for /readyz, and posts the same isotonic fit (``--rows`` rows)
three times: the wall time of the first over the second's is the figure
(median over starts), with each answer's ``fit_seconds`` and its
``summary.timings.wait`` (the time the fit waited for a fit worker).
/readyz answers once the fit workers have started and warmed up, so a
client that waits for readiness finds them ready.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Server, Target, machine, median, write_results  # noqa: E402

NEED = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    scores = rng.random(args.rows)
    labels = (rng.random(args.rows) < scores).astype(int)
    started_machine = machine()
    rows = []
    for start in range(args.starts):
        with Server() as server:
            fits = []
            for i in range(3):
                began = time.perf_counter()
                answer = server.fit(f"first-fit-{i}", "isotonic", scores, labels)
                fits.append((time.perf_counter() - began, answer["fit_seconds"], answer["summary"]["timings"]["wait"]))
        rows.append(fits)
        print(f"  start {start + 1}: " + ", ".join(f"{wall:.3f} s" for wall, _, _ in fits), file=sys.stderr, flush=True)
    ratios = [fits[0][0] / fits[1][0] for fits in rows]
    ratio = median(ratios)
    lines = [
        "## The first fit after a start (target 32.4)",
        "",
        f"`benchmarks/first_fit.py --starts {args.starts} --rows {args.rows}`; {started_machine}. `calibd serve` started "
        f"afresh each time (one fit worker, the default), /readyz awaited, then the same {args.rows:,}-row isotonic "
        "fit posted three times. Wall times are the client's; fit_seconds and timings.wait the answers'.",
        "",
        "| start | 1st fit wall (fit_seconds, wait) | 2nd | 3rd | 1st / 2nd |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, fits in enumerate(rows, 1):
        cells = [f"{wall:.3f} s ({fit:.3f} s, {wait * 1e3:.1f} ms)" for wall, fit, wait in fits]
        lines.append(f"| {n} | {' | '.join(cells)} | {fits[0][0] / fits[1][0]:.2f} |")
    lines += ["", f"Median 1st / 2nd: **{ratio:.2f}** (target <= {NEED:g}: {'met' if ratio <= NEED else 'NOT met'})."]
    first, second = median([f[0][0] for f in rows]), median([f[1][0] for f in rows])
    targets = [Target("32.4", f"the first fit after a start against the second, same {args.rows:,}-row isotonic body",
                      f"{first:.3f} s", f"{second:.3f} s (second fit)", ratio, f"<= {NEED:g}x", ratio <= NEED)]
    write_results("first_fit", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
