"""Benchmark: the multiclass calibrators, held-out quality and fit times.

    .venv/bin/python benchmarks/multiclass.py [--runs 5] [--seeds 5] [--quick]

(1) Quality. For each dataset a calibrator is fitted on one split and every
    figure is measured on a separate test split: top-label ECE and class-wise
    ECE (15 equal-width bins, calibd.metrics.ece with target="top_label" and
    "classwise"), log-loss and Brier score, before calibration ("none") and
    after each method. Datasets:
      * synthetic overconfident logits, K = 10 and K = 100: true logits
        z* ~ N(0, 2^2 I), labels y ~ softmax(z*); the model reports
        z = 2.5 z* + d with a fixed per-class offset d ~ N(0, 0.5^2)
        (overconfident, with class biases). Calibration split 5,000 (K = 10)
        or 20,000 (K = 100) rows, test split 20,000 rows.
      * scikit-learn's digits (1,797 images, 10 classes): an MLP trained on a
        third, the calibrators fitted on its predict_proba (input
        "probability") on another third, evaluated on the last third.
    Each figure is the mean over ``--seeds`` random draws / splits. Under each
    table, for top_label_histogram: the ECE of the confidence it gives the
    input's top class (what it calibrates) and how often the output's argmax
    moved away from the input's (then the top-label column scores another class).
(2) Fit time at n = 100,000, K = 100 (the synthetic overconfident logits):
    temperature, vector and dirichlet (diagonal), each next to scikit-learn's
    CalibratedClassifierCV(method="temperature") on the same logits (wrapped
    in FrozenEstimator around an estimator whose decision_function returns
    them), run alternately in the same process; medians of ``--runs`` runs and
    the median of the per-run ratios. Our time is ``fit`` (validation
    included); scikit-learn's is CalibratedClassifierCV.fit.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibd.calibration import get_method  # noqa: E402
from calibd.metrics import brier, ece, log_loss  # noqa: E402

METHODS: list[tuple[str, dict]] = [
    ("temperature", {}),
    ("vector", {}),
    ("matrix", {}),
    ("dirichlet", {"variant": "full"}),
    ("dirichlet", {"variant": "diagonal"}),
    ("dirichlet", {"variant": "fixed_diagonal"}),
    ("ovr_platt", {}),
    ("ovr_isotonic", {}),
    ("top_label_histogram", {}),
    ("lp_patch", {}),
]


def label(method: str, options: dict) -> str:
    return method + "".join(f" ({v})" for v in options.values())


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sample_labels(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.minimum((p.cumsum(axis=1) < rng.uniform(size=(p.shape[0], 1))).sum(axis=1), p.shape[1] - 1)


def overconfident(k: int, n: int, rng: np.random.Generator, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Model logits z = 2.5 z* + offset, labels from softmax(z*), z* ~ N(0, 4 I)."""
    true = rng.normal(0.0, 2.0, (n, k))
    return 2.5 * true + offset, sample_labels(softmax(true), rng)


def synthetic(k: int, n_cal: int, n_test: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    offset = rng.normal(0.0, 0.5, k)
    cal = overconfident(k, n_cal, rng, offset)
    test = overconfident(k, n_test, rng, offset)
    return {"input": "logit", "cal": cal, "test": test, "raw": lambda z: softmax(z)}


def digits(seed: int) -> dict:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, train_size=1 / 3, random_state=seed, stratify=y)
    x_cal, x_test, y_cal, y_test = train_test_split(x_rest, y_rest, train_size=0.5, random_state=seed, stratify=y_rest)
    scaler = StandardScaler().fit(x_train)
    model = MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-4, max_iter=2000, random_state=seed)
    model.fit(scaler.transform(x_train), y_train)

    def proba(features):
        p = model.predict_proba(scaler.transform(features))
        return p / p.sum(axis=1, keepdims=True)

    return {"input": "probability", "cal": (proba(x_cal), y_cal), "test": (proba(x_test), y_test), "raw": lambda p: p}


def metrics(p: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    return (
        ece(p, y, target="top_label"),
        ece(p, y, target="classwise"),
        log_loss(p, y),
        brier(p, y),
    )


def quality(name: str, make, seeds: int) -> None:
    rows: dict[str, list[tuple[float, ...]]] = {}
    fit_seconds: dict[str, list[float]] = {}
    top_class: list[tuple[float, float]] = []
    for seed in range(seeds):
        data = make(seed)
        (s_cal, y_cal), (s_test, y_test) = data["cal"], data["test"]
        rows.setdefault("none", []).append(metrics(data["raw"](s_test), y_test))
        for method, options in METHODS:
            key = label(method, options)
            calibrator = get_method(method).from_options(data["input"], options)
            started = time.perf_counter()
            calibrator.fit(s_cal, y_cal)
            fit_seconds.setdefault(key, []).append(time.perf_counter() - started)
            out = calibrator.predict(s_test)
            rows.setdefault(key, []).append(metrics(out, y_test))
            if method == "top_label_histogram":
                # What the method calibrates: the confidence it gives the input's top class.
                predicted = data["raw"](s_test).argmax(axis=1)
                confidence = out[np.arange(predicted.shape[0]), predicted]
                top_class.append(
                    (ece(confidence, (y_test == predicted).astype(int)), float(np.mean(out.argmax(axis=1) != predicted)))
                )
    k = data["cal"][0].shape[1]
    print(
        f"\n### {name}: K = {k}, {data['cal'][0].shape[0]} calibration rows, {data['test'][0].shape[0]} test rows,"
        f" input {data['input']}, mean of {seeds} draws\n"
    )
    print("| method | top-label ECE | class-wise ECE | log-loss | Brier | fit s |")
    print("|---|---|---|---|---|---|")
    for key, values in rows.items():
        mean = np.mean(values, axis=0)
        fit = f"{np.mean(fit_seconds[key]):.2f}" if key in fit_seconds else ""
        print(f"| {key} | {mean[0]:.4f} | {mean[1]:.4f} | {mean[2]:.4f} | {mean[3]:.4f} | {fit} |")
    if top_class:
        ece_top, changed = np.mean(top_class, axis=0)
        print(
            f"\ntop_label_histogram: ECE of the confidence it gives the input's top class {ece_top:.4f};"
            f" the output's argmax differs from the input's on {changed:.1%} of test rows (the rest of the"
            " mass, spread in proportion to the input probabilities, can exceed the calibrated top value),"
            " and the top-label ECE column measures the output's argmax."
        )


def sklearn_temperature(z: np.ndarray, y: np.ndarray):
    """scikit-learn's temperature scaling of precomputed logits (fit included)."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator

    return CalibratedClassifierCV(FrozenEstimator(_logits_estimator(z.shape[1])), method="temperature").fit(z, y)


def _logits_estimator(k: int):
    """A fitted classifier whose decision_function returns its input, the precomputed logits."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Logits(ClassifierMixin, BaseEstimator):
        def __init__(self, k: int = 2):
            self.k = k

        def fit(self, x, y=None):
            self.classes_ = np.arange(self.k)
            return self

        def decision_function(self, x):
            return np.asarray(x)

        def predict(self, x):
            return np.asarray(x).argmax(axis=1)

    return Logits(k).fit(None)


def seconds(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def timing(runs: int, n: int = 100_000, k: int = 100) -> None:
    data = synthetic(k, n, 10, seed=0)
    z, y = data["cal"]
    reference = sklearn_temperature(z, y)
    ours = get_method("temperature")(input="logit").fit(z, y)
    t_sklearn = float(1.0 / np.ravel(reference.calibrated_classifiers_[0].calibrators[0].beta_)[0])
    print(f"\n### Fit time, n = {n:,}, K = {k} (synthetic overconfident logits), median of {runs} runs\n")
    print(f"Fitted temperature: ours {ours.temperature_:.6f}, scikit-learn {t_sklearn:.6f}.\n")
    print("| method | ours, s | scikit-learn CalibratedClassifierCV(method=\"temperature\"), s | ours / scikit-learn | target |")
    print("|---|---|---|---|---|")
    for method, options, target in [
        ("temperature", {}, "< 1 s"),
        ("vector", {}, "< 10 s"),
        ("dirichlet", {"variant": "diagonal"}, "< 10 s"),
    ]:
        pairs = []
        for _ in range(runs):
            a = seconds(lambda: get_method(method).from_options("logit", options).fit(z, y))
            b = seconds(lambda: sklearn_temperature(z, y))
            pairs.append((a, b))
        ours_s = statistics.median(a for a, _ in pairs)
        theirs = statistics.median(b for _, b in pairs)
        ratio = statistics.median(a / b for a, b in pairs)
        print(f"| {label(method, options)} | {ours_s:.3f} | {theirs:.3f} | {ratio:.2f} | {target} |")


def lp_patch_at_scale(n_fit: int, n_test: int) -> None:
    """lp_patch where its guarantee bites: a holdout large enough for the accuracy it derives to
    be below the miscalibration (on the holdouts above it patches nothing and serves rho(R(f)))."""
    from calibd.calibration.lp_patch import canonical
    from calibd.metrics import lp_error
    from calibd.metrics.lp import round_codes

    def draw(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        z = rng.normal(0.0, 5.0, (n, 3))
        return softmax(z), sample_labels(softmax(z / 5.0), rng)

    (p_fit, y_fit), (p_test, y_test) = draw(n_fit, 11), draw(n_test, 12)
    print(f"\n### lp_patch at scale: K = 3, {n_fit:,} holdout rows, {n_test:,} held-out rows\n")
    print("Softmax of N(0, 25) logits, labels drawn from softmax(z / 5) (five times too confident); lambda = 10.")
    print("Held-out lp_error of the input, of rho(R(f)) (rounding alone, what lp_patch serves on bins it never "
          "patches) and of lp_patch, beside the epsilon the fit reports for the population.\n")
    print("| p | input | rho(R(f)) | lp_patch | reported epsilon | patched groups | alpha | fit s |")
    print("|---|---|---|---|---|---|---|---|")
    rounded = canonical(round_codes(p_test, 10), 10)
    for order in (2, 3, "inf"):
        calibrator = get_method("lp_patch").from_options("probability", {"p": order})
        started = time.perf_counter()
        calibrator.fit(p_fit, y_fit)
        seconds = time.perf_counter() - started
        info = calibrator.fit_info()
        print(f"| {order} | {lp_error(p_test, y_test, p=order):.4f} | {lp_error(rounded, y_test, p=order):.4f} "
              f"| {lp_error(calibrator.predict(p_test), y_test, p=order):.4f} | {info['epsilon']:.4f} "
              f"| {info['patched_groups']} | {info['alpha']:.4f} | {seconds:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="timing runs (at least 3)")
    parser.add_argument("--seeds", type=int, default=5, help="draws / splits averaged in the quality tables")
    parser.add_argument("--quick", action="store_true", help="skip the K = 100 quality table")
    args = parser.parse_args()
    runs = max(3, args.runs)
    import scipy
    import sklearn

    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, scikit-learn"
        f" {sklearn.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f},"
        f" OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    )
    quality("Synthetic overconfident logits", lambda s: synthetic(10, 5_000, 20_000, s), args.seeds)
    if not args.quick:
        quality("Synthetic overconfident logits", lambda s: synthetic(100, 20_000, 20_000, s), args.seeds)
    quality("Digits (MLP)", digits, args.seeds)
    lp_patch_at_scale(1_000_000 if not args.quick else 300_000, 500_000)
    timing(runs)


if __name__ == "__main__":
    main()
