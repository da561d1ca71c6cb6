"""Fit times at n = 1,000,000 against the reference implementations (targets 3a-3c of issue 8).

    .venv/bin/python benchmarks/fit_times.py [--runs 5] [--n 1000000]

* isotonic: ``IsotonicCalibrator().fit(s, y).predict(new)`` against scikit-learn's
  ``IsotonicRegression(out_of_bounds="clip").fit(s, y).predict(new)``, 1,000,000
  new scores;
* Platt: ``PlattCalibrator(input="logit", smooth_targets=True).fit(z, y)`` against
  scikit-learn's sigmoid calibration, ``_SigmoidCalibration().fit(z, y)`` (what
  CalibratedClassifierCV(method="sigmoid") fits; the same smoothed targets), on the
  same logits z;
* beta: ``BetaCalibrator().fit(s, y)`` (variant abm) against betacal's
  ``BetaCalibration("abm").fit(s, y)``, run in a scratch virtualenv that has betacal
  (CALIBD_BETACAL_PYTHON, else /tmp/ref-venv/bin/python, created with pip when
  missing), in a worker process that loads the data once and fits on request;
* temperature (binary, no target): ``TemperatureCalibrator(input="logit").fit(z, y)``
  against scikit-learn's ``_TemperatureScaling().fit(z, y)``.

Validation is inside every timed call, ours and theirs. Each run times ours and
the reference back to back, alternating which goes first; figures are medians
over runs, the ratio is the median of the per-run ratios (ours / reference, so
<= 1.1 meets the target). Process CPU time is shown too: scikit-learn's losses
run on both cores (OpenMP), numpy's elementwise work on one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Target, machine, median, write_results  # noqa: E402
from calibd.calibration.beta import BetaCalibrator  # noqa: E402
from calibd.calibration.isotonic import IsotonicCalibrator  # noqa: E402
from calibd.calibration.platt import PlattCalibrator  # noqa: E402
from calibd.calibration.temperature import TemperatureCalibrator  # noqa: E402

REF_VENV = Path("/tmp/ref-venv")


def timed(function) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = function()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def betacal_python(create: bool) -> tuple[str | None, str]:
    """A Python that can import betacal, and how it was found (or why there is none)."""
    candidates = [os.environ.get("CALIBD_BETACAL_PYTHON"), str(REF_VENV / "bin" / "python")]
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run([python, "-c", "import betacal, sklearn"],
                                                    capture_output=True).returncode == 0:
            return python, python
    if not create:
        return None, "no Python with betacal (set CALIBD_BETACAL_PYTHON)"
    try:
        subprocess.run(["python3", "-m", "venv", str(REF_VENV)], check=True, capture_output=True, timeout=120)
        subprocess.run([str(REF_VENV / "bin" / "pip"), "install", "--quiet", "betacal", "scikit-learn"],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as error:
        return None, f"betacal could not be installed into {REF_VENV}: {type(error).__name__}"
    python = str(REF_VENV / "bin" / "python")
    ok = subprocess.run([python, "-c", "import betacal, sklearn"], capture_output=True).returncode == 0
    return (python, python) if ok else (None, f"betacal not importable in {REF_VENV}")


class BetacalWorker:
    def __init__(self, python: str, scores: np.ndarray, labels: np.ndarray):
        self.folder = Path(tempfile.mkdtemp(prefix="betacal-"))
        np.savez(self.folder / "data.npz", scores=scores, labels=labels)
        self.process = subprocess.Popen(
            [python, str(ROOT / "benchmarks" / "_betacal_worker.py"), str(self.folder / "data.npz")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.info = json.loads(self.process.stdout.readline())

    def fit(self) -> dict:
        self.process.stdin.write("fit\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--no-install", action="store_true", help="do not create the betacal virtualenv")
    args = parser.parse_args(argv)

    from sklearn.calibration import _SigmoidCalibration, _TemperatureScaling
    from sklearn.isotonic import IsotonicRegression
    import sklearn

    rng = np.random.default_rng(0)
    n = args.n
    s = rng.beta(2.0, 3.0, n)
    z_true = 1.3 * (np.log(s) - np.log1p(-s)) + 0.25
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z_true))).astype(np.int64)
    z = np.log(s) - np.log1p(-s)
    new = rng.random(n)
    started_machine = machine()

    python, found = betacal_python(create=not args.no_install)
    worker = BetacalWorker(python, s, y) if python else None

    def ours_iso():
        return IsotonicCalibrator().fit(s, y).predict(new)

    def ref_iso():
        return IsotonicRegression(out_of_bounds="clip").fit(s, y).predict(new)

    def ours_platt():
        model = PlattCalibrator(input="logit", smooth_targets=True).fit(z, y)
        return np.array([model.a_, model.b_])

    def ref_platt():
        model = _SigmoidCalibration().fit(z, y)
        return np.array([-model.a_, -model.b_])  # scikit-learn: 1 / (1 + exp(a f + b))

    def ours_beta():
        model = BetaCalibrator().fit(s, y)
        return np.array([model.a_, model.b_, model.c_])

    def ours_temperature():
        return TemperatureCalibrator(input="logit").fit(z, y).temperature_

    def ref_temperature():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _TemperatureScaling().fit(z, y).beta_

    pairs = {
        "isotonic": (ours_iso, ref_iso),
        "platt": (ours_platt, ref_platt),
        "beta": (ours_beta, None),
        "temperature": (ours_temperature, ref_temperature),
    }
    times = {name: {"ours": [], "ours_cpu": [], "ref": [], "ref_cpu": [], "ratio": []} for name in pairs}
    outputs: dict[str, tuple] = {}
    for name, (ours, ref) in pairs.items():  # warm-up, and the outputs compared below
        ours_out = ours()
        if name == "beta":
            ref_out = np.array(worker.fit()["coef"]) if worker else None
            if ref_out is not None and ref_out.size == 3:
                ref_out = np.array([ref_out[0], ref_out[1], ref_out[2]])
        else:
            ref_out = ref()
        outputs[name] = (ours_out, ref_out)
    for run in range(args.runs):
        for name, (ours, ref) in pairs.items():
            if name == "beta" and worker is None:
                wall, cpu, _ = timed(ours)
                times[name]["ours"].append(wall)
                times[name]["ours_cpu"].append(cpu)
                continue
            order = ("ours", "ref") if run % 2 == 0 else ("ref", "ours")
            got = {}
            for side in order:
                if side == "ours":
                    got[side] = timed(ours)[:2]
                elif name == "beta":
                    answer = worker.fit()
                    got[side] = (answer["wall"], answer["cpu"])
                else:
                    got[side] = timed(ref)[:2]
            times[name]["ours"].append(got["ours"][0])
            times[name]["ours_cpu"].append(got["ours"][1])
            times[name]["ref"].append(got["ref"][0])
            times[name]["ref_cpu"].append(got["ref"][1])
            times[name]["ratio"].append(got["ours"][0] / got["ref"][0])
            print(f"  run {run + 1} {name}: ours {got['ours'][0]:.3f} s, reference {got['ref'][0]:.3f} s",
                  file=sys.stderr, flush=True)
    if worker:
        worker.close()

    labels = {
        "isotonic": ("3a", "isotonic fit + predict on 1,000,000 new scores", "scikit-learn IsotonicRegression"),
        "platt": ("3b", "Platt fit (logits, Platt's smoothed targets)", "scikit-learn _SigmoidCalibration"),
        "beta": ("3c", "beta fit (abm)", f"betacal {worker.info['betacal'] if worker else ''} BetaCalibration"),
        "temperature": ("", "temperature fit (binary logits)", "scikit-learn _TemperatureScaling"),
    }
    agreement = {
        "isotonic": f"max |p - p_sklearn| = {np.max(np.abs(outputs['isotonic'][0] - outputs['isotonic'][1])):.1e}",
        "platt": "a, b: ours " + ", ".join(f"{v:.6f}" for v in outputs["platt"][0])
                 + "; scikit-learn " + ", ".join(f"{v:.6f}" for v in outputs["platt"][1]),
        "beta": "a, b, c: ours " + ", ".join(f"{v:.5f}" for v in outputs["beta"][0])
                + ("; betacal " + ", ".join(f"{v:.5f}" for v in outputs["beta"][1]) if outputs["beta"][1] is not None else ""),
        "temperature": f"T: ours {outputs['temperature'][0]:.6f}; scikit-learn (two-logit form) 1/beta/2 = "
                       f"{1 / outputs['temperature'][1] / 2:.6f}",
    }
    lines = [
        "## Fit times at n = 1,000,000 (targets 3a-3c)",
        "",
        f"`benchmarks/fit_times.py --runs {args.runs} --n {n}`; {started_machine}; scikit-learn {sklearn.__version__}"
        + (f", betacal from {found}" if worker else f"; betacal: {found}") + ". "
        "Validation included on both sides; ours and the reference alternate within each run. "
        "Ratio = median over runs of our wall time / the reference's (target <= 1.1).",
        "",
        "| fit | ours, wall (CPU) | reference | reference, wall (CPU) | ratio (each run) | target | same result |",
        "|---|---:|---|---:|---|---|---|",
    ]
    targets = []
    for name in pairs:
        key, what, reference = labels[name]
        t = times[name]
        ours_wall, ours_cpu = median(t["ours"]), median(t["ours_cpu"])
        if t["ref"]:
            ratio = median(t["ratio"])
            ref_text = f"{median(t['ref']):.3f} s ({median(t['ref_cpu']):.3f} s)"
            runs = ", ".join(f"{r:.2f}" for r in t["ratio"])
            verdict = ("met" if ratio <= 1.1 else "NOT met") if key else "(no target)"
            lines.append(f"| {what} | {ours_wall:.3f} s ({ours_cpu:.3f} s) | {reference} | {ref_text} | **{ratio:.2f}** ({runs}) "
                         f"| {'<= 1.1: ' + verdict if key else verdict} | {agreement[name]} |")
        else:
            ratio = None
            lines.append(f"| {what} | {ours_wall:.3f} s ({ours_cpu:.3f} s) | {reference} | unavailable: {found} | | | |")
        if key:
            targets.append(Target(
                key=key, target=f"fit time, {what}, n = {n:,}",
                figure=f"{ours_wall:.3f} s", baseline=(f"{median(t['ref']):.3f} s ({reference})" if t["ref"] else f"unavailable: {found}"),
                ratio=ratio, requirement="<= 1.1x", met=ratio is not None and ratio <= 1.1,
            ))
    write_results("fit_times", "\n".join(lines), targets)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
