"""BernPolyFusion (papers/002, Wang & Liu): the paper's protocol on data we can ship, and fit times.

    .venv/bin/python benchmarks/bernstein.py              # everything, a few minutes on 2 cores
    .venv/bin/python benchmarks/bernstein.py --rounds 3 --test-size 200000 --no-solvers   # a quick look

Protocol (section 5.2 of the paper): per round, three disjoint draws; two
small neural networks (scikit-learn MLPClassifier, one hidden layer of 10 and
of 20 units, as in section 5.1) are trained on the first and second draw, and
the calibrators on the third (the networks' two scores per row); everything
else is the test set. 10 rounds; mean and standard deviation.

Data:
- synthetic: x ~ N(0, I_8), P(y=1 | x) = sigmoid(eta(x)) with a non-linear eta;
  draws of 500 rows as in the paper, and 1,000,000 test rows, so that the
  paper's grid metric has cells of at least 1000 test points.
- digits (scikit-learn, 1797 rows): odd against even digit; draws of 400 rows,
  597 test rows.
- breast-cancer (scikit-learn, 569 rows): malignant against benign; draws of
  120 rows, 209 test rows.

Metrics, in %:
- grid ECE and MCE, the paper's: [0, 1]^2 in the ECDF-mapped scores (the
  calibration draw's ECDF, as the paper maps every score) is cut into 10 x 10
  equal cells; cells with fewer than 1000 test points are dropped; in each
  remaining cell the "true" probability is the test points' positive rate and
  the estimate is the calibrator at the cell's centre (mapped back to raw
  scores by the inverse ECDF); ECE is the mean absolute gap over the cells and
  MCE the largest. Synthetic data only (the real test sets are too small).
- ECE: the usual one, 15 equal-width bins of the predicted probability.
- Brier score.

Methods: bernstein (degree by 5-fold CV, the default options); isotonic
regression on each network's score alone; logistic stacking (logistic
regression on the two scores' logits, C = 1e10: no effective penalty); and the plain average of
the two networks' probabilities, uncalibrated, for reference.

Fit times: n = 500, 1000 and 100,000 rows of two scores; a fixed degree
(K = 5, the paper's section 5.1 choice, and K = 10) and the 5-fold degree
search (the default: upwards from K = 1 to at most 20, stopping 3 degrees
after the last improvement); median of repeated runs, wall clock and process CPU time
(the paper reports CPU time: 0.501 s at n = 500 and 0.872 s at n = 1000 with
CVX). Then the solver comparison on one n = 1000 quadratic program.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.datasets import load_breast_cancer, load_digits  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from calibd.calibration.bernstein import (  # noqa: E402
    BernsteinCalibrator,
    grid_pairs,
    gram,
    solve_monotone_qp,
)
from calibd.calibration._threads import single_threaded_blas  # noqa: E402
from calibd.calibration.isotonic import IsotonicCalibrator  # noqa: E402
from calibd.metrics import brier, ece  # noqa: E402

METHODS = ("bernstein", "isotonic (score 1)", "isotonic (score 2)", "logistic stacking", "average, uncalibrated")

# Table 1 of the paper (%), mean ± sd over 10 rounds; its "ECE" and "MCE" are the grid metrics.
PAPER_DATASETS = ("Adult", "Census", "Covertypes", "Dota2", "SUSY", "Mean")
PAPER = {
    "MCE": {
        "MR-MIC": ("6.142±0.843", "7.116±0.825", "5.785±0.611", "5.353±0.576", "6.185±0.479", "6.116±0.667"),
        "CopulaFusion": ("5.309±0.723", "6.817±0.611", "5.882±0.626", "6.290±0.508", "6.592±0.469", "6.178±0.587"),
        "BernPolyFusion": ("5.613±0.650", "6.241±0.565", "5.367±0.434", "5.591±0.528", "5.054±0.394", "5.573±0.514"),
    },
    "ECE": {
        "MR-MIC": ("2.459±0.441", "3.787±0.468", "3.444±0.359", "3.124±0.393", "3.182±0.258", "3.199±0.384"),
        "CopulaFusion": ("2.548±0.296", "3.890±0.444", "3.369±0.326", "3.319±0.343", "2.963±0.240", "3.218±0.330"),
        "BernPolyFusion": ("2.226±0.309", "3.587±0.370", "2.847±0.231", "2.799±0.268", "2.432±0.241", "2.727±0.284"),
    },
    "Brier": {
        "MR-MIC": ("15.485±0.915", "19.719±1.338", "19.776±0.861", "18.740±0.758", "19.015±0.646", "18.547±0.904"),
        "CopulaFusion": ("16.441±0.703", "19.714±1.095", "18.067±0.824", "19.264±0.711", "17.771±0.506", "18.252±0.768"),
        "BernPolyFusion": ("14.375±0.854", "18.966±0.724", "16.095±0.577", "16.811±0.434", "15.539±0.473", "16.357±0.612"),
    },
}


# -- data ------------------------------------------------------------------------------
def synthetic_eta(x: np.ndarray) -> np.ndarray:
    return 1.5 * (x[:, 0] + 0.8 * x[:, 1] - 0.6 * x[:, 2] + 0.5 * x[:, 0] * x[:, 3] + 0.4 * (x[:, 4] ** 2 - 1) + 0.3 * np.sin(2 * x[:, 5]))


def synthetic(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 8))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-synthetic_eta(x)))).astype(int)
    return x, y


def real(name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(X, y, draw size): three draws and the rest for testing."""
    if name == "digits":
        data = load_digits()
        return data.data, (data.target % 2).astype(int), 400
    data = load_breast_cancer()
    return data.data, (data.target == 0).astype(int), 120


def networks(seed: int) -> tuple:
    def net(hidden: int, offset: int):
        return make_pipeline(
            StandardScaler(), MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=2000, random_state=seed + offset)
        )

    return net(10, 0), net(20, 1)


def scores_of(models, x: np.ndarray) -> np.ndarray:
    return np.column_stack([m.predict_proba(x)[:, 1] for m in models])


# -- methods ---------------------------------------------------------------------------------
class Stacking:
    """Logistic regression on the two scores' logits."""

    def fit(self, s: np.ndarray, y: np.ndarray) -> "Stacking":
        self.model = LogisticRegression(C=1e10, max_iter=1000).fit(self._features(s), y)
        return self

    @staticmethod
    def _features(s: np.ndarray) -> np.ndarray:
        p = np.clip(s, 1e-7, 1 - 1e-7)
        return np.log(p / (1 - p))

    def predict(self, s: np.ndarray) -> np.ndarray:
        return self.model.predict_proba(self._features(s))[:, 1]


def fit_methods(s: np.ndarray, y: np.ndarray) -> dict:
    bern = BernsteinCalibrator().fit(s, y)
    iso1 = IsotonicCalibrator().fit(s[:, 0], y)
    iso2 = IsotonicCalibrator().fit(s[:, 1], y)
    stack = Stacking().fit(s, y)
    return {
        "bernstein": bern.predict,
        "isotonic (score 1)": lambda t: iso1.predict(t[:, 0]),
        "isotonic (score 2)": lambda t: iso2.predict(t[:, 1]),
        "logistic stacking": stack.predict,
        "average, uncalibrated": lambda t: t.mean(axis=1),
        "_bernstein": bern,
    }


def grid_metrics(predict, bern: BernsteinCalibrator, s_test: np.ndarray, y_test: np.ndarray, min_count: int = 1000):
    """The paper's 10 x 10 grid ECE and MCE in the ECDF-mapped score square, and the cell count."""
    u = bern._transform(s_test)
    cell = np.minimum((u * 10).astype(int), 9)
    flat = cell[:, 0] * 10 + cell[:, 1]
    counts = np.bincount(flat, minlength=100)
    positives = np.bincount(flat, weights=y_test, minlength=100)
    keep = np.flatnonzero(counts >= min_count)
    rate = positives[keep] / counts[keep]
    centres_u = np.column_stack([(keep // 10 + 0.5) / 10, (keep % 10 + 0.5) / 10])
    offsets = np.asarray(bern.knot_offsets_).astype(int)
    centres = np.column_stack(
        [
            np.interp(centres_u[:, j], bern.knots_u_[offsets[j] : offsets[j + 1]], bern.knots_x_[offsets[j] : offsets[j + 1]])
            for j in range(2)
        ]
    )
    gaps = np.abs(rate - predict(centres))
    return float(gaps.mean()), float(gaps.max()), int(keep.shape[0])


def run_rounds(dataset: str, rounds: int, test_size: int) -> tuple[dict, dict]:
    """Per method, lists over rounds of each metric; and the chosen degrees, cells, bad rounds."""
    results = {m: {"grid ECE": [], "grid MCE": [], "ECE": [], "Brier": []} for m in METHODS}
    extra = {"degrees": [], "cells": []}
    for r in range(rounds):
        rng = np.random.default_rng(1000 + r)
        if dataset == "synthetic":
            draws = [synthetic(500, rng) for _ in range(3)]
            x_test, y_test = synthetic(test_size, rng)
        else:
            x, y, size = real(dataset)
            order = rng.permutation(x.shape[0])
            draws = [(x[order[i * size : (i + 1) * size]], y[order[i * size : (i + 1) * size]]) for i in range(3)]
            x_test, y_test = x[order[3 * size :]], y[order[3 * size :]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            models = networks(r)
            for model, (xd, yd) in zip(models, draws[:2]):
                model.fit(xd, yd)
        s_cal = scores_of(models, draws[2][0])
        s_test = scores_of(models, x_test)
        fitted = fit_methods(s_cal, draws[2][1])
        bern = fitted.pop("_bernstein")
        extra["degrees"].append(bern.degree_)
        for method in METHODS:
            p = fitted[method](s_test)
            results[method]["ECE"].append(100 * ece(p, y_test, n_bins=15))
            results[method]["Brier"].append(100 * brier(p, y_test))
            if dataset == "synthetic":
                g_ece, g_mce, cells = grid_metrics(fitted[method], bern, s_test, y_test)
                results[method]["grid ECE"].append(100 * g_ece)
                results[method]["grid MCE"].append(100 * g_mce)
                if method == "bernstein":
                    extra["cells"].append(cells)
    return results, extra


def fmt(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{np.mean(values):.3f}±{np.std(values, ddof=1) if len(values) > 1 else 0.0:.3f}"


def print_results(dataset: str, results: dict, extra: dict, rounds: int) -> None:
    grid = dataset == "synthetic"
    columns = ["grid MCE", "grid ECE", "ECE (15 bins)", "Brier"] if grid else ["ECE (15 bins)", "Brier"]
    keys = {"ECE (15 bins)": "ECE", "grid MCE": "grid MCE", "grid ECE": "grid ECE", "Brier": "Brier"}
    print(f"\n### {dataset}: {rounds} rounds, % (mean ± sd)\n")
    print("| method | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for method in METHODS:
        print(f"| {method} | " + " | ".join(fmt(results[method][keys[c]]) for c in columns) + " |")
    degrees = np.bincount(extra["degrees"])
    chosen = ", ".join(f"K={k}: {c}" for k, c in enumerate(degrees) if c)
    print(f"\nbernstein's cross-validated degree over the rounds: {chosen}.")
    if grid:
        print(f"Grid cells with >= 1000 test points: {min(extra['cells'])} to {max(extra['cells'])} of 100.")


def print_paper() -> None:
    print("\n### The paper's table 1 (%; five UCI datasets, n = 500 draws, 10 rounds; grid MCE and ECE)\n")
    print("| metric | method | " + " | ".join(PAPER_DATASETS) + " |")
    print("|---" * (len(PAPER_DATASETS) + 2) + "|")
    for metric, rows in PAPER.items():
        for method, values in rows.items():
            print(f"| {metric} | {method} | " + " | ".join(values) + " |")


# -- fit times ------------------------------------------------------------------------------
def timed(fn, repeats: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return float(np.median(walls)), float(np.median(cpus))


def fit_times(quick: bool) -> dict:
    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        models = networks(0)
        for model in models:
            model.fit(*synthetic(500, rng))
    data = {n: (scores_of(models, x), y) for n, (x, y) in ((n, synthetic(n, rng)) for n in (500, 1000, 100_000))}
    rows = []
    for n in (500, 1000, 100_000):
        s, y = data[n]
        big = n >= 100_000
        for label, options, repeats in (
            ("K = 5", {"degree": 5}, 3 if big else 21),
            ("K = 10", {"degree": 10}, 3 if big else 21),
            ("5-fold CV", {}, 3 if big else (5 if quick else 11)),
        ):
            BernsteinCalibrator(**options).fit(s[:1000], y[:1000])  # warm up
            wall, cpu = timed(lambda: BernsteinCalibrator(**options).fit(s, y), repeats)
            chosen = BernsteinCalibrator(**options).fit(s, y).degree_
            rows.append((n, label, chosen, repeats, wall, cpu))
    print("\n### Fit times, two scores (median; wall clock and process CPU seconds)\n")
    print("| n | degree | chosen K | runs | wall s | CPU s | paper (CPU s, CVX) |")
    print("|---|---|---|---|---|---|---|")
    paper = {(500, "5-fold CV"): "0.501 ± 0.044", (1000, "5-fold CV"): "0.872 ± 0.090"}
    for n, label, chosen, repeats, wall, cpu in rows:
        print(f"| {n:,} | {label} | {chosen} | {repeats} | {wall:.4f} | {cpu:.4f} | {paper.get((n, label), '')} |")
    s, y = data[1000]
    rows_m = []
    for m, options in ((1, {}), (3, {}), (4, {}), (3, {"degree": 9}), (4, {"degree": 4})):
        extra_scores = np.column_stack([s] + [s[:, :1] + 0.05 * rng.normal(size=(1000, 1))] * 2)[:, :m]
        extra_scores = np.clip(extra_scores, 0, 1)
        wall, cpu = timed(lambda: BernsteinCalibrator(**options).fit(extra_scores, y), 3)
        fitted = BernsteinCalibrator(**options).fit(extra_scores, y)
        rows_m.append((m, options.get("degree", "CV"), fitted.degree_, (fitted.degree_ + 1) ** m, wall, cpu))
    print("\n### Other M at n = 1000 (median of 3)\n")
    print("| M | degree | chosen K | coefficients | wall s | CPU s |")
    print("|---|---|---|---|---|---|")
    for m, option, chosen, count, wall, cpu in rows_m:
        print(f"| {m} | {option} | {chosen} | {count} | {wall:.4f} | {cpu:.4f} |")
    s_big, _ = data[100_000]
    bern = BernsteinCalibrator(degree=5).fit(*data[1000])
    for size in (1, 100, 10_000, 100_000):
        wall, cpu = timed(lambda: bern.predict(s_big[:size]), 21 if size < 100_000 else 5)
        print(f"predict {size:,} rows (M = 2, K = 5): {1000 * wall:.3f} ms wall, {1000 * cpu:.3f} ms CPU")
    return data


def solver_comparison(data: dict) -> None:
    """One n = 1000, M = 2 quadratic program, solved by this module's interior point and SciPy's alternatives."""
    from scipy.linalg import cholesky, solve_triangular
    from scipy.optimize import LinearConstraint, minimize, nnls

    s, y = data[1000]
    bern = BernsteinCalibrator(degree=5).fit(s, y)
    u = bern._transform(s)
    w = np.full(1000, 1e-3)
    print("\n### Solvers on one quadratic program (n = 1000, M = 2; median wall seconds)\n")
    print("| K | variables | constraints | solver | seconds | objective − best |")
    print("|---|---|---|---|---|---|")
    for k in (5, 10):
        h, g, _, _ = gram(u, y.astype(float), w, k)
        lam = 1e-6 * np.trace(h) / h.shape[0]
        hess, lin = h + lam * np.eye(h.shape[0]), g + lam * y.mean()
        lower, upper = grid_pairs(k, 2)
        p, c = hess.shape[0], lower.shape[0] + 2
        a = np.zeros((c, p))
        a[np.arange(c - 2), upper], a[np.arange(c - 2), lower] = 1.0, -1.0
        a[-2, 0], a[-1, -1] = 1.0, -1.0
        b = np.zeros(c)
        b[-1] = -1.0

        def objective(x):
            return 0.5 * x @ hess @ x - lin @ x

        def ours():
            with single_threaded_blas():
                return solve_monotone_qp(hess, lin, k, 2)[0]

        def ldp_nnls():
            # Lawson & Hanson's least distance programming through NNLS.
            chol = cholesky(hess, lower=True)
            free = solve_triangular(chol.T, solve_triangular(chol, lin, lower=True), lower=False)
            gmat = solve_triangular(chol, a.T, lower=True).T
            hvec = b - a @ free
            e = np.vstack([gmat.T, hvec[None, :]])
            f = np.zeros(e.shape[0])
            f[-1] = 1.0
            sol, _ = nnls(e, f, maxiter=50 * e.shape[1])
            r = e @ sol - f
            return free + solve_triangular(chol.T, -r[:-1] / r[-1], lower=False)

        def slsqp():
            return minimize(objective, np.full(p, 0.5), jac=lambda x: hess @ x - lin, method="SLSQP",
                            constraints=[{"type": "ineq", "fun": lambda x: a @ x - b, "jac": lambda x: a}],
                            options={"maxiter": 1000, "ftol": 1e-12}).x

        def trust():
            return minimize(objective, np.full(p, 0.5), jac=lambda x: hess @ x - lin, hess=lambda x: hess,
                            constraints=[LinearConstraint(a, b, np.inf)], method="trust-constr",
                            options={"maxiter": 3000, "gtol": 1e-10}).x

        candidates = [("interior point (this module)", ours, 21), ("SciPy nnls (LDP)", ldp_nnls, 5),
                      ("SciPy trust-constr", trust, 3 if k == 5 else 1)]
        candidates.append(("SciPy SLSQP", slsqp, 1))
        found = []
        for name, fn, repeats in candidates:
            with single_threaded_blas():  # the same BLAS setting for every solver
                wall, _ = timed(fn, repeats)
                found.append((name, wall, objective(fn())))
        best = min(v for _, _, v in found)
        for name, wall, value in found:
            print(f"| {k} | {p} | {c} | {name} | {wall:.4f} | {value - best:.1e} |")
    print("\nQP packages are not dependencies; measured the same way during development (one BLAS thread, ms):")
    print("K = 10: Clarabel 22, OSQP 29, quadprog 32 (this interior point 8); M = 2, K = 20 (441 variables):")
    print("Clarabel 374, OSQP 482, quadprog 2157 (this interior point 106); M = 4, K = 4 (625 variables):")
    print("Clarabel 634, OSQP 3109, quadprog 8318 (this interior point 194).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--test-size", type=int, default=1_000_000, help="synthetic test rows")
    parser.add_argument("--no-solvers", action="store_true", help="skip the solver comparison")
    parser.add_argument("--no-times", action="store_true", help="skip the fit times")
    args = parser.parse_args()
    started = time.perf_counter()
    print("## bernstein (papers/002): BernPolyFusion on shippable data")
    for dataset in ("synthetic", "digits", "breast-cancer"):
        results, extra = run_rounds(dataset, args.rounds, args.test_size)
        print_results(dataset, results, extra, args.rounds)
    print_paper()
    if not args.no_times:
        data = fit_times(quick=args.rounds < 10)
        if not args.no_solvers:
            solver_comparison(data)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
