"""Closed-loop recalibration on a drifting stream: ECE over time, before, during and after the drift.

A calibd server (SQLite, a fresh database) serves a Platt calibrator fitted on
pre-drift data, with an alarm-triggered recalibration policy. A stream of
labelled batches goes through /calibrate and /feedback; from batch
``--drift-at`` on, the world shifts (true logit + ``--shift``). For every
batch the table gives the version served, the ECE of what it served (the
labels are known), the drift alarm, and the loop's events.

    python benchmarks/closed_loop.py [--batches 40] [--batch-size 1000] [--drift-at 10] [--shift 1.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from calibd.metrics import ece, log_loss  # noqa: E402
from tests.processes import free_port, stop, wait_ready  # noqa: E402


def stream(n: int, rng: np.random.Generator, shift: float) -> tuple[np.ndarray, np.ndarray]:
    z = rng.normal(-1.0, 1.5, n)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(z + shift)))).astype(int)
    return z, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--drift-at", type=int, default=10)
    parser.add_argument("--shift", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    port = free_port()
    folder = tempfile.mkdtemp(prefix="calibd-closed-loop-")
    env = os.environ | {
        "CALIBD_DATABASE_URL": f"sqlite:///{folder}/calibd.db",
        "CALIBD_RECALIBRATION_INTERVAL_SECONDS": "0.5",
        "CALIBD_JSON_LOGS": "false",
    }
    server = subprocess.Popen([sys.executable, "-m", "calibd.cli", "serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, f"{url}/readyz", 60, "calibd serve")
        http = httpx.Client(base_url=url, timeout=300)
        z, y = stream(3000, rng, 0.0)
        http.post("/calibrators", json={"name": "stream", "method": "platt", "input": "logit",
                                        "holdout": {"scores": z.tolist(), "labels": y.tolist()}}).raise_for_status()
        http.put("/calibrators/stream/recalibration", json={
            "trigger": "alarm", "refit_rows": 3000, "min_refit_rows": 1000, "shadow_rows": 2000, "margin": 0.001,
        }).raise_for_status()
        rows, seen = [], 0
        for batch in range(1, args.batches + 1):
            shift = args.shift if batch >= args.drift_at else 0.0
            zb, yb = stream(args.batch_size, rng, shift)
            served = http.post("/calibrate", json={"calibrator": "stream", "scores": zb.tolist()}).json()
            p = np.array(served["probabilities"])
            http.post("/feedback", json={"calibrator": "stream", "version": served["version"], "probabilities": p.tolist(),
                                         "scores": zb.tolist(), "labels": yb.tolist()}).raise_for_status()
            time.sleep(1.2)  # a couple of loop passes
            monitor = http.get("/calibrators/stream/monitor").json()
            state = http.get("/calibrators/stream/recalibration").json()
            new = list(reversed(state["events"]))[seen:]
            seen += len(new)
            rows.append((batch, shift, served["version"], ece(p, yb), log_loss(p, yb), monitor["drift"]["alarm"],
                         ", ".join(f"{e['outcome']} v{e['candidate_version']}" for e in new)))
    finally:
        stop(server, timeout=60)

    print(f"## Closed-loop recalibration (drift: logit shift {args.shift:+} from batch {args.drift_at}; "
          f"{args.batch_size} labels per batch)\n")
    print("| batch | true shift | version served | ECE served | log-loss served | drift alarm | loop events |")
    print("|---:|---:|---:|---:|---:|---|---|")
    for batch, shift, version, e, ll, alarm, happened in rows:
        print(f"| {batch} | {shift:+.1f} | {version} | {e:.4f} | {ll:.4f} | {'yes' if alarm else 'no'} | {happened} |")
    before = [r[3] for r in rows if r[1] == 0]
    during = [r[3] for r in rows if r[1] != 0 and r[2] == 1]
    after = [r[3] for r in rows if r[1] != 0 and r[2] > 1]
    print()
    print("| phase | batches | mean ECE served |")
    print("|---|---:|---:|")
    for phase, values in (("before the drift", before), ("drifted, old version", during), ("after promotion", after)):
        print(f"| {phase} | {len(values)} | {np.mean(values) if values else float('nan'):.4f} |")


if __name__ == "__main__":
    main()
