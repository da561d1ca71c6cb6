"""Multicalibration suite: calibd's ``multicalibration`` against MCGrad 0.1.5, on held-out rows.

    .venv/bin/python benchmarks/segments.py                        # everything: 9 generators x 2 sizes x 5 seeds + real tables
    .venv/bin/python benchmarks/segments.py --sizes 20000 --seeds 5 --large-seeds 1
    .venv/bin/python benchmarks/segments.py --cases interaction2,fair --sizes 20000 --seeds 1   # a few

Cases:

* nine synthetic generators with known truth (tests/segment_cases.py: two- and
  three-way interactions, numeric thresholds, a 150-valued column with a long
  tail, rare segments under 0.5% of rows, miscalibration of opposite signs, a
  1% base rate, an already multicalibrated input, label noise). A size is the
  number of rows calibrated on; as many fresh rows test.
* every table shipped inside scikit-learn or statsmodels with a binary label
  and categorical columns: statsmodels' ``fair`` (6,366 rows; label: any
  affair; segments rate_marriage, religious, occupation, educ), ``anes96``
  (944 rows; label: vote; segments PID, educ, income, TVnews) and
  ``modechoice`` (840 rows; label: the mode chosen; segments mode, psize,
  hinc in thirds). scikit-learn ships no such table (breast_cancer, iris,
  wine, digits: numeric columns only). Each is split in thirds by seed: a
  deliberately weak base model (a logistic regression on one or two numeric
  columns that never sees the segments) is fitted on the first, the
  calibrators on the second, and the third tests.

Each method with its default options: calibd ``multicalibration`` (the
features: the categorical and numeric columns) and MCGrad (its defaults,
LightGBM on one thread, in its own virtualenv: mcgrad --no-deps plus the
packages it imports). Reported on the test rows: mcgrad's own
``MulticalibrationError`` (defaults, float64; its segments from the
categorical and numeric columns) and its sigma, the global ECCE sigma, log
loss, and fit seconds of one call. On the largest size the whole fit of
``POST /calibrators`` (``calibd.calibration.fitting.fit_calibrator``:
validation, the fit, the 5-fold cross-fitted summary; every stage of
``summary.timings``) is timed as well, against MCGrad's bare fit. Both fit
on one thread: LightGBM's and BLAS's (calibd's fit workers limit BLAS to one
thread; this process and the MCGrad worker do the same). On the
synthetic cases the true probabilities are measured the same way: the test
labels were drawn from them, so their MCE sigma is the test rows' noise alone,
the floor no calibrator can be expected to beat (one fitted on n noisy labels
carries that draw's noise as well).

Development and held-out: the defaults were developed on the generators in
``DEVELOPMENT`` at seed 100 and 20,000 rows only, and checked on every generator
at the training seeds 100 and 101; the evaluation seeds start at 0. The report
gives the other generators and the real tables (never looked at while
choosing) separately.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Target, machine, median, write_results  # noqa: E402
from calibd.calibration.fitting import fit_calibrator  # noqa: E402
from calibd.calibration.multicalibration import MulticalibrationCalibrator  # noqa: E402
from calibd.metrics import log_loss  # noqa: E402
from calibd.metrics.multicalibration import multicalibration_error  # noqa: E402
from tests.segment_cases import CASES, Case  # noqa: E402

VENV = Path(os.environ.get("CALIBD_MCGRAD_VENV", "/tmp/mcgrad-venv"))
#: One BLAS thread in the MCGrad worker too (LightGBM is given one thread by its parameters).
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
WORKER = ROOT / "benchmarks" / "_mcgrad_worker.py"
REAL = ("fair", "anes96", "modechoice")
#: The generators the defaults were developed on, and one added later to check variants on (no default changed).
DEFAULTS_DEVELOPED_ON = ("interaction2", "high_cardinality", "sign_flip", "calibrated")
CHECKED_LATER_ON = ("steps",)
DEVELOPMENT = DEFAULTS_DEVELOPED_ON + CHECKED_LATER_ON
#: Measured beside input, calibd and MCGrad where the case knows it (synthetic): the true probabilities, the noise floor.
TRUTH = "truth"


def worker(python: str, *arguments: str) -> None:
    """Run the MCGrad worker; its warnings (unshrink factors) are shown only if it fails."""
    done = subprocess.run([python, str(WORKER), *arguments], capture_output=True, text=True, env={**os.environ, **ONE_THREAD})
    if done.returncode:
        raise RuntimeError(f"MCGrad worker {arguments[0]} failed:\n{done.stderr}")


def mcgrad_python() -> str:
    """A Python with mcgrad 0.1.5 importable (created with pip on first use)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import mcgrad.methods, statsmodels; assert mcgrad.__version__ == '0.1.5'"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
    pip = str(VENV / "bin" / "pip")
    # mcgrad's metadata pulls torch, ax-platform and CUDA wheels that its fit, predict and metrics never import
    subprocess.run([pip, "install", "--quiet", "--no-deps", "mcgrad==0.1.5"], check=True)
    subprocess.run([pip, "install", "--quiet", "numpy", "scipy", "scikit-learn", "pandas", "lightgbm", "psutil",
                    "typing_extensions", "statsmodels"], check=True)
    subprocess.run(check, check=True)
    return str(python)


# -- cases ---------------------------------------------------------------------------------------
def synthetic(name: str, n: int, seed: int) -> tuple[Case, Case]:
    """(calibration rows, test rows): n each, one draw."""
    case = CASES[name](2 * n, np.random.default_rng([seed, n]))
    return case.take(np.arange(n)), case.take(np.arange(n, 2 * n))


def real(name: str, seed: int, python: str, folder: Path) -> tuple[Case, Case]:
    """Thirds of a statsmodels table: a weak base model on the first, calibration and test rows after."""
    from sklearn.linear_model import LogisticRegression

    path = folder / f"{name}.npz"
    if not path.exists():
        worker(python, "dataset", name, str(path))
    data = np.load(path)
    if name == "fair":
        y = (data["affairs"] > 0).astype(np.int64)
        X = np.column_stack([data["age"], data["yrs_married"]])
        columns = {c: data[c] for c in ("rate_marriage", "religious", "occupation", "educ")}
    elif name == "anes96":
        y = data["vote"].astype(np.int64)
        X = np.column_stack([data["age"]])
        columns = {c: data[c] for c in ("PID", "educ", "income", "TVnews")}
    else:  # modechoice: one row per (traveller, mode); the label is the mode chosen
        y = data["choice"].astype(np.int64)
        X = np.column_stack([data["invc"]])
        columns = {"mode": data["mode"], "psize": data["psize"],
                   "hinc": np.digitize(data["hinc"], np.quantile(data["hinc"], [1 / 3, 2 / 3]))}
    categorical = {c: np.array([f"{c}{int(v)}" for v in values]) for c, values in columns.items()}
    order = np.random.default_rng(seed).permutation(y.shape[0])
    base, fit_rows, test_rows = np.array_split(order, 3)
    p = LogisticRegression().fit(X[base], y[base]).predict_proba(X)[:, 1]
    whole = Case(p, y, np.full(y.shape[0], np.nan), categorical)
    return whole.take(fit_rows), whole.take(test_rows)


# -- one run -------------------------------------------------------------------------------------
def features_of(case: Case) -> dict[str, list]:
    return {**{c: v.tolist() for c, v in case.categorical.items()}, **{c: v.tolist() for c, v in case.numeric.items()}}


def run(train: Case, test: Case, python: str, folder: Path, time_request: bool) -> dict[str, dict]:
    case_path = folder / "case.npz"
    arrays = {"train_p": train.score, "train_y": train.y, "test_p": test.score, "test_y": test.y,
              "categorical": np.array(list(train.categorical), dtype=str), "numeric": np.array(list(train.numeric), dtype=str)}
    for part, rows in (("train", train), ("test", test)):
        arrays.update({f"{part}_{c}": v.astype(str) for c, v in rows.categorical.items()})
        arrays.update({f"{part}_{c}": v.astype(np.float64) for c, v in rows.numeric.items()})
    np.savez(case_path, **arrays)

    predictions, fit_seconds, info = {"input": test.score}, {}, {}
    if np.isfinite(test.truth).all():  # the real tables have no truth
        predictions[TRUTH] = test.truth
    calibrator = MulticalibrationCalibrator()
    started = time.perf_counter()
    calibrator.fit(train.score, train.y, features=features_of(train))
    fit_seconds["calibd"] = time.perf_counter() - started
    predictions["calibd"] = calibrator.predict(test.score, features=features_of(test))
    info["calibd"] = calibrator.fit_info()["training"]

    out_path = folder / "mcgrad.npz"
    worker(python, "fit", str(case_path), str(out_path), "1")
    out = np.load(out_path)
    predictions["MCGrad"], fit_seconds["MCGrad"] = out["predicted"], float(out["fit_seconds"])
    info["MCGrad"] = {"rounds": int(out["rounds"])}

    predictions_path = folder / "predictions.npz"
    np.savez(predictions_path, **predictions)
    check_path = folder / "mce.json"
    worker(python, "mce", str(case_path), str(predictions_path), str(check_path))
    theirs = json.loads(check_path.read_text())
    rows: dict[str, dict] = {}
    for name in predictions:
        p = np.clip(predictions[name], 1e-15, 1 - 1e-15)
        whole = multicalibration_error(p, test.y, None, {}, max_depth=0)["global"]
        rows[name] = {"mce_sigma": theirs[name]["mce_sigma"], "mce": theirs[name]["mce"], "ecce_sigma": whole["sigma"],
                      "log_loss": log_loss(p, test.y), "fit": fit_seconds.get(name, 0.0)}
    rows["calibd"]["start"] = info["calibd"].get("start")
    rows["calibd"]["rounds"] = len(info["calibd"].get("history", [])) - 1
    rows["MCGrad"]["rounds"] = info["MCGrad"]["rounds"]
    if time_request:
        started = time.perf_counter()
        result = fit_calibrator("multicalibration", "probability", None, train.score, train.y,
                                arrays={"features": features_of(train)})
        rows["calibd"]["request"] = time.perf_counter() - started
        rows["calibd"]["timings"] = result.summary["timings"]
    return rows


# -- report --------------------------------------------------------------------------------------
def case_table(runs: list[dict]) -> str:
    lines = ["| case | rows | seeds | input MCE sigma | calibd MCE sigma | MCGrad MCE sigma | truth MCE sigma | ratio (median; worst) | "
             "calibd ECCE sigma | MCGrad ECCE sigma | input log loss | calibd log loss | MCGrad log loss | calibd fit s | MCGrad fit s | "
             "POST /calibrators fit s |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["case"], r["size"]) for r in runs}, key=lambda k: (k[0] in REAL, k[1], k[0]))
    for case, size in keys:
        group = [r for r in runs if r["case"] == case and r["size"] == size]
        m = lambda method, key: median([r[method][key] for r in group])  # noqa: E731
        ratios = [r["calibd"]["mce_sigma"] / r["MCGrad"]["mce_sigma"] for r in group]
        request = [r["calibd"]["request"] for r in group if "request" in r["calibd"]]
        truth = [r[TRUTH]["mce_sigma"] for r in group if TRUTH in r]
        lines.append(
            f"| {case}{'' if case in REAL or case in DEVELOPMENT else ' (held out)'} | {size:,} | {len(group)} | "
            f"{m('input', 'mce_sigma'):.2f} | {m('calibd', 'mce_sigma'):.2f} | {m('MCGrad', 'mce_sigma'):.2f} | "
            f"{f'{median(truth):.2f}' if truth else '–'} | {median(ratios):.2f}; {max(ratios):.2f} | {m('calibd', 'ecce_sigma'):.2f} | {m('MCGrad', 'ecce_sigma'):.2f} | "
            f"{m('input', 'log_loss'):.5f} | {m('calibd', 'log_loss'):.5f} | {m('MCGrad', 'log_loss'):.5f} | "
            f"{m('calibd', 'fit'):.2f} | {m('MCGrad', 'fit'):.2f} | {f'{median(request):.2f}' if request else '–'} |")
    return "\n".join(lines)


def summary(runs: list[dict], label: str) -> tuple[str, dict]:
    if not runs:
        return f"{label}: no runs.", {}
    # at most: to rounding (both methods returning the input unchanged can differ in the last bit)
    ratio = np.array([r["calibd"]["mce_sigma"] / r["MCGrad"]["mce_sigma"] for r in runs])
    loss_gap = np.array([r["calibd"]["log_loss"] - r["MCGrad"]["log_loss"] for r in runs])
    input_gap = np.array([r["calibd"]["log_loss"] - r["input"]["log_loss"] for r in runs])
    figures = {"pairs": len(runs), "at_most": float(np.mean(ratio <= 1.0 + 1e-9)), "worst": float(ratio.max()),
               "median": float(np.median(ratio)), "loss_gap": float(loss_gap.max()), "input_gap": float(input_gap.max())}
    text = (f"{label}: {len(runs)} (case, seed) pairs; calibd's MCE sigma at most MCGrad's in {figures['at_most']:.0%}, "
            f"ratio median {figures['median']:.2f}, worst {figures['worst']:.2f}; log loss minus MCGrad's at most "
            f"{figures['loss_gap']:+.5f}, minus the input's at most {figures['input_gap']:+.5f}.")
    return text, figures


def noise_floor(runs: list[dict]) -> str:
    """How the true probabilities score against MCGrad, and each method against them, on the pairs that know them.

    A method's MCE sigma is the test rows' noise plus its fit's own error, and a fit on n noisy labels carries
    that draw's noise too; a ratio of two fits near this floor is decided by the two draws.
    """
    known = [r for r in runs if TRUTH in r]
    if not known:
        return "Noise floor: no pair with known truth."
    truth = np.array([r[TRUTH]["mce_sigma"] for r in known])
    theirs = np.array([r["MCGrad"]["mce_sigma"] for r in known])
    ours = np.array([r["calibd"]["mce_sigma"] for r in known])
    over = truth / theirs
    worst = known[int(np.argmax(over))]
    return (f"Noise floor ({len(known)} synthetic pairs, the true probabilities as the prediction): their MCE sigma median "
            f"{np.median(truth):.2f} (range {truth.min():.2f} to {truth.max():.2f}); at most MCGrad's in {np.mean(over <= 1.0 + 1e-9):.0%}, "
            f"ratio to MCGrad's median {np.median(over):.2f}, worst {over.max():.2f} ({worst['case']}, seed {worst['seed']}); "
            f"calibd's over the truth's median {np.median(ours / truth):.2f}, worst {(ours / truth).max():.2f}; "
            f"MCGrad's over the truth's median {np.median(theirs / truth):.2f}, worst {(theirs / truth).max():.2f}.")


def targets_of(runs: list[dict], largest: int) -> list[Target]:
    _, f = summary(runs, "")
    timed = [r for r in runs if "request" in r["calibd"] and r["size"] == largest]
    # the same two figures for the true probabilities, where known: what the noise of the draws allows
    known = [r for r in runs if TRUTH in r]
    floor = np.array([r[TRUTH]["mce_sigma"] / r["MCGrad"]["mce_sigma"] for r in known])
    share_note = f"the true probabilities themselves: {np.mean(floor <= 1.0 + 1e-9):.0%} of {len(known)} synthetic pairs" if known else ""
    worst_note = f"the true probabilities themselves: {floor.max():.2f}" if known else ""
    median_note = f"the true probabilities themselves: {np.median(floor):.2f}" if known else ""
    out = [
        Target("31.1a", "suite: share of (case, seed) pairs with calibd MCE sigma <= MCGrad's", f"{f['at_most']:.0%}",
               f"{f['pairs']} pairs", f["at_most"], ">= 90%", f["at_most"] >= 0.9, share_note),
        Target("31.1b", "suite: worst ratio of MCE sigma, calibd / MCGrad", f"{f['worst']:.2f}", "MCGrad", f["worst"],
               "<= 1.1x", f["worst"] <= 1.1, worst_note),
        Target("31.1c", "suite: median ratio of MCE sigma, calibd / MCGrad", f"{f['median']:.2f}", "MCGrad", f["median"],
               "<= 0.85x", f["median"] <= 0.85, median_note),
        Target("31.2a", "suite: worst log loss gap, calibd - MCGrad", f"{f['loss_gap']:+.5f}", "MCGrad", None,
               "<= +0.001", f["loss_gap"] <= 0.001),
        Target("31.2b", "suite: worst log loss gap, calibd - input", f"{f['input_gap']:+.5f}", "input", None,
               "<= +0.001", f["input_gap"] <= 0.001),
    ]
    if timed:
        ours = median([r["calibd"]["request"] for r in timed])
        theirs = median([r["MCGrad"]["fit"] for r in timed])
        worst = max(r["calibd"]["request"] / r["MCGrad"]["fit"] for r in timed)
        out.append(Target("31.3", f"{largest:,} rows: POST /calibrators fit (cross-fitted summary) vs MCGrad's bare fit, one thread",
                          f"{ours:.1f} s", f"{theirs:.1f} s", ours / theirs, "<= 1x (every case)", worst <= 1.0,
                          f"worst case {worst:.2f}x"))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join([*CASES, *REAL]), help="comma-separated generators and real tables")
    parser.add_argument("--sizes", default="20000,200000", help="rows calibrated on (synthetic)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per case below 100,000 rows")
    parser.add_argument("--large-seeds", type=int, default=5, help="seeds per case from 100,000 rows")
    parser.add_argument("--splits", type=int, default=10, help="splits of each real table")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--no-request", action="store_true", help="skip timing fit_calibrator at the largest size")
    parser.add_argument("--out", type=Path, default=None, help="also write every run as JSON lines here")
    parser.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    parser.add_argument("--report", type=Path, nargs="+", default=None,
                        help="no runs: build the section from these --out files (runs made apart, e.g. one per size)")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    largest = max(sizes)
    if args.report:
        runs = [json.loads(line) for path in args.report for line in path.read_text().splitlines() if line.strip()]
        largest = max(r["size"] for r in runs)
        report(runs, largest, f"{machine()} (when the section was assembled; each run's load is in its file)",
               "benchmarks/segments.py --report " + " ".join(str(p) for p in args.report) + ", from runs of "
               + "; ".join(sorted({r.get("command", "?") for r in runs})), None, args.no_write)
        return
    python = mcgrad_python()
    import lightgbm  # noqa: F401  (imported once before the first timed fit, as a serving process has it)
    from threadpoolctl import threadpool_limits

    # One BLAS thread, as calibd's fit workers run (app/workers/pool.py): with two threads on a busy
    # machine the segment stage's small Newton solves waited for each other, tens of ms a solve instead of 0.2 ms.
    threadpool_limits(1)

    load = machine()
    command = "benchmarks/segments.py " + " ".join(argv if argv is not None else sys.argv[1:])
    runs: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="segments-") as tmp:
        folder = Path(tmp)
        plan = []
        for case in cases:
            if case in REAL:
                plan += [(case, 0, seed) for seed in range(args.first_seed, args.first_seed + args.splits)]
            else:
                for size in sizes:
                    seeds = args.large_seeds if size >= 100_000 else args.seeds
                    plan += [(case, size, seed) for seed in range(args.first_seed, args.first_seed + seeds)]
        for case, size, seed in plan:
            train, test = real(case, seed, python, folder) if case in REAL else synthetic(case, size, seed)
            rows = run(train, test, python, folder, time_request=size == largest and not args.no_request)
            entry = {"case": case, "size": train.y.shape[0], "seed": seed, "command": command.strip(), "load": os.getloadavg()[0], **rows}
            runs.append(entry)
            print(json.dumps({"case": case, "size": entry["size"], "seed": seed,
                              **{m: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[m].items()} for m in rows}}),
                  flush=True)
            if args.out:
                with args.out.open("a") as handle:
                    handle.write(json.dumps(entry) + "\n")
    report(runs, largest, load, command.strip(), time.perf_counter() - started, args.no_write)


def report(runs: list[dict], largest: int, load: str, command: str, elapsed: float | None, no_write: bool) -> None:
    held = [r for r in runs if r["case"] not in DEVELOPMENT]
    lines = [summary(runs, "All")[0], summary([r for r in runs if r["case"] in DEVELOPMENT], "Development generators")[0],
             summary([r for r in held if r["case"] not in REAL], "Held-out generators")[0],
             summary([r for r in runs if r["case"] in REAL], "Real tables")[0], noise_floor(runs)]
    loads = [r["load"] for r in runs if "load" in r]
    spent = f", {elapsed / 60:.0f} min" if elapsed is not None else ""
    load_range = f" Load average during the runs {min(loads):.1f} to {max(loads):.1f}." if loads else ""
    section = "\n\n".join([
        "## Multicalibration suite: calibd against MCGrad 0.1.5",
        f"{load}. `{command}`{spent}.{load_range} Both methods with their default options, LightGBM and BLAS on one thread. "
        "MCE: mcgrad's own MulticalibrationError (defaults, float64) on the test rows (synthetic: as many fresh rows as "
        "calibrated on; real tables: the test third). Ratio: calibd's MCE sigma over MCGrad's, per (case, seed). "
        "Truth: the true probabilities of a synthetic case as the prediction (the test labels were drawn from them), the "
        "noise floor. POST /calibrators fit: fit_calibrator (validation, fit, 5-fold cross-fitted summary) in process, on one thread. "
        "Defaults developed on " + ", ".join(DEFAULTS_DEVELOPED_ON) + " at seed 100 and checked on every generator at seeds 100 and 101 "
        f"(training seeds: no default changed); {', '.join(CHECKED_LATER_ON)}, a development generator of the numeric kind added later, "
        "checked the variants of docs/multicalibration.md at 200,000 rows, seeds 100 and 101 (no default changed). The seeds "
        "here start at 0 and were never used to choose anything. The generators not used in development are marked held out.",
        case_table(runs),
        "\n".join(f"- {line}" for line in lines),
    ])
    print(section)
    if not no_write:
        write_results("segments", section, targets_of(runs, largest))


if __name__ == "__main__":
    main()
