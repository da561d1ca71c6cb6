"""Reference values of calibration metrics from the libraries users know, as test fixtures.

Run in a scratch environment that has the reference packages (the test suite
does not need them):

    python3 -m venv /tmp/metrics-ref
    /tmp/metrics-ref/bin/pip install torch==2.13.0 netcal==1.4.0 relplot==1.0.3 uncertainty-calibration==0.1.4 scikit-learn
    /tmp/metrics-ref/bin/python benchmarks/reference/metrics_reference.py

It builds fixed arrays (from a seed, or from an exact arithmetic recipe for
the large case), computes with

* scikit-learn ``calibration_curve`` (uniform 15 bins, quantile 10 bins),
* netcal ``ECE`` (equal width and equal mass, 15 bins) and ``MCE``,
* relplot ``smECE`` (and its bandwidth),
* uncertainty-calibration ``get_calibration_error`` (p=2, debias=True: it
  picks equal-mass bins for continuous outputs, one bin per value for
  discrete ones; ``mode`` top-label and marginal for multiclass),

writes them with the arrays to tests/fixtures/metrics_reference.json, and
prints a table comparing each with calibd's value on the same arrays under
the same convention. tests/test_metrics_reference.py checks the fixture to 1e-9.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import calibration as uc  # noqa: E402  (uncertainty-calibration)
import relplot  # noqa: E402
from netcal.metrics import ECE, MCE  # noqa: E402
from sklearn.calibration import calibration_curve  # noqa: E402

from calibd.metrics import debiased_l2_ce, ece, prepare, reliability_diagram, smooth_ece  # noqa: E402

SEED = 20260101
OUT = REPO / "tests" / "fixtures" / "metrics_reference.json"


def weyl_case(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Well-calibrated binary data from exact arithmetic (identical on every machine):
    p_i = frac(i * golden) and y_i = 1[frac(i * plastic) < p_i]. Mirrored in the tests."""
    i = np.arange(n, dtype=np.float64)
    p = np.modf(i * 0.6180339887498949)[0]
    u = np.modf(i * 0.7548776662466927)[0]
    return p, (u < p).astype(np.int64)


def make_cases() -> dict[str, dict]:
    rng = np.random.default_rng(SEED)
    cases: dict[str, dict] = {}

    n = 2000
    p = rng.beta(2.0, 3.0, n)
    truth = np.clip(p + 0.12 * np.sin(6.0 * p), 0.0, 1.0)
    y = (rng.random(n) < truth).astype(np.int64)
    cases["binary"] = {"p": p, "y": y}

    levels = np.array([0.0, 0.05, 0.1, 0.2, 1 / 3, 0.4, 0.5, 0.6, 2 / 3, 0.8, 0.95, 1.0])
    p = levels[rng.integers(0, levels.shape[0], 2000)]
    y = (rng.random(2000) < np.clip(p * 0.9 + 0.04, 0, 1)).astype(np.int64)
    cases["binary_discrete"] = {"p": p, "y": y}

    n, k = 1200, 4
    logits = rng.normal(size=(n, k)) * 1.5
    true = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = np.array([rng.choice(k, p=row) for row in true])
    sharp = np.exp(1.6 * logits)
    cases["multiclass"] = {"p": sharp / sharp.sum(axis=1, keepdims=True), "y": y}

    p, y = weyl_case(100_000)
    cases["binary_weyl"] = {"p": p, "y": y, "recipe": {"name": "weyl", "n": 100_000}}
    return cases


def references(p: np.ndarray, y: np.ndarray) -> dict:
    refs: dict = {}
    if p.ndim == 1:
        conf, correct = p, y
    else:
        conf, correct = relplot.multiclass_logits_to_confidences(p, y, probs=True)
    for strategy, bins in (("uniform", 15), ("quantile", 10)):
        prob_true, prob_pred = calibration_curve(correct, conf, n_bins=bins, strategy=strategy)
        refs[f"sklearn_calibration_curve_{strategy}_{bins}"] = {
            "prob_true": prob_true.tolist(),
            "prob_pred": prob_pred.tolist(),
            # right-closed bins: only comparable when no prediction sits on an interior edge
            "on_interior_edge": on_interior_edge(p, y, strategy, bins),
        }
    refs["netcal_ece_uniform_15"] = float(ECE(bins=15, equal_intervals=True).measure(p, y))
    try:
        refs["netcal_ece_quantile_15"] = float(ECE(bins=15, equal_intervals=False).measure(p, y))
    except ValueError as error:  # tied predictions give repeated quantile edges, which scipy refuses
        refs["netcal_ece_quantile_15"] = None
        refs["netcal_ece_quantile_15_error"] = str(error)
    refs["netcal_mce_uniform_15"] = float(MCE(bins=15, equal_intervals=True).measure(p, y))
    value, sigma = relplot.smECE(conf.astype(np.float64), correct.astype(np.float64), return_width=True)
    refs["relplot_smece"] = float(value)
    refs["relplot_smece_sigma"] = float(sigma)
    if p.ndim == 1:
        refs["uc_debiased_l2"] = float(uc.get_calibration_error(p, y, p=2, debias=True))
        refs["uc_is_discrete"] = bool(uc.is_discrete(p))
    else:
        refs["uc_debiased_l2_top_label"] = float(uc.get_calibration_error(p, y, p=2, debias=True, mode="top-label"))
        refs["uc_is_discrete_top_label"] = bool(uc.is_discrete(conf))
        refs["uc_debiased_l2_marginal"] = float(uc.get_calibration_error(p, y, p=2, debias=True, mode="marginal"))
        refs["uc_is_discrete_marginal"] = bool(uc.is_discrete(p))
    return refs


def on_interior_edge(p: np.ndarray, y: np.ndarray, strategy: str, bins: int) -> bool:
    """Whether some (top-label) prediction lies exactly on an interior edge of scikit-learn's bins,
    where its right-closed bins and calibd's left-closed ones disagree."""
    conf = p if p.ndim == 1 else p.max(axis=1)
    edges = np.linspace(0, 1, bins + 1) if strategy == "uniform" else np.percentile(conf, np.linspace(0, 1, bins + 1) * 100)
    return bool(np.isin(conf, edges[1:-1]).any())


def ours(p: np.ndarray, y: np.ndarray, refs: dict) -> dict[str, float | list]:
    """calibd's value for each reference key, under the reference's convention."""
    out: dict = {}
    data = prepare(p, y)
    target = "binary" if p.ndim == 1 else "top_label"
    for strategy, bins in (("uniform", 15), ("quantile", 10)):
        diagram = reliability_diagram(data, None, n_bins=bins, binning=strategy, target=target)
        full = [b for b in diagram["bins"] if b["count"] > 0]
        out[f"sklearn_calibration_curve_{strategy}_{bins}"] = {
            "prob_true": [b["observed_frequency"] for b in full],
            "prob_pred": [b["mean_prediction"] for b in full],
        }
    out["netcal_ece_uniform_15"] = ece(data, None, n_bins=15, binning="uniform", target=target)
    out["netcal_ece_quantile_15"] = ece(data, None, n_bins=15, binning="quantile", target=target)
    out["netcal_mce_uniform_15"] = ece(data, None, n_bins=15, norm="max", target=target)
    value, sigma = smooth_ece(data, None, target=target, return_sigma=True)
    out["relplot_smece"], out["relplot_smece_sigma"] = value, sigma
    if p.ndim == 1:
        binning = "discrete" if refs["uc_is_discrete"] else "quantile"
        out["uc_debiased_l2"] = debiased_l2_ce(data, None, binning=binning)
    else:
        binning = "discrete" if refs["uc_is_discrete_top_label"] else "quantile"
        out["uc_debiased_l2_top_label"] = debiased_l2_ce(data, None, binning=binning, target="top_label")
        binning = "discrete" if refs["uc_is_discrete_marginal"] else "quantile"
        out["uc_debiased_l2_marginal"] = debiased_l2_ce(data, None, binning=binning, target="classwise")
    return out


def difference(a, b) -> float:
    if isinstance(a, dict):
        if len(a["prob_true"]) != len(b["prob_true"]):
            return float("inf")
        return max(
            float(np.max(np.abs(np.subtract(a[key], b[key])))) for key in ("prob_true", "prob_pred")
        )
    if isinstance(a, bool):
        return 0.0
    return abs(float(a) - float(b))


def main() -> None:
    cases = make_cases()
    fixture: dict = {
        "generated_by": "benchmarks/reference/metrics_reference.py",
        "seed": SEED,
        "versions": {name: version(name) for name in ("numpy", "scikit-learn", "netcal", "relplot", "uncertainty-calibration")},
        "cases": {},
    }
    rows = []
    for name, case in cases.items():
        p, y = case["p"], case["y"]
        refs = references(p, y)
        entry: dict = {"references": refs}
        if "recipe" in case:
            entry["recipe"] = case["recipe"]
            entry["checksum"] = {"sum_p": float(np.sum(p)), "sum_y": int(np.sum(y))}
        else:
            entry["probabilities"] = p.tolist()
            entry["labels"] = y.tolist()
        fixture["cases"][name] = entry
        mine = ours(p, y, refs)
        for key, theirs in refs.items():
            if key.startswith("uc_is_discrete") or key.endswith("_error"):
                continue
            if theirs is None:
                rows.append((name, key, f"{mine[key]:.15g}", "netcal raises: " + refs[key + "_error"], float("nan")))
                continue
            value = mine[key]
            shown_ours = f"{len(value['prob_true'])} bins" if isinstance(value, dict) else f"{value:.15g}"
            shown_theirs = f"{len(theirs['prob_true'])} bins" if isinstance(theirs, dict) else f"{theirs:.15g}"
            if isinstance(theirs, dict) and theirs["on_interior_edge"]:
                shown_theirs += " (predictions on interior edges: right-closed bins differ by convention; not compared)"
                rows.append((name, key, shown_ours, shown_theirs, float("nan")))
                continue
            rows.append((name, key, shown_ours, shown_theirs, difference(value, theirs)))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}; versions: {fixture['versions']}\n")
    print("| case | reference | calibd | reference value | abs difference |")
    print("|---|---|---|---|---|")
    for name, key, a, b, d in rows:
        print(f"| {name} | {key} | {a} | {b} | {'n/a' if d != d else f'{d:.2e}'} |")
    worst = max(r[-1] for r in rows if r[-1] == r[-1])
    print(f"\nlargest difference: {worst:.2e}")
    if worst > 1e-9:
        raise SystemExit("disagreement above 1e-9")


if __name__ == "__main__":
    main()
