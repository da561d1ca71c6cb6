"""Benchmark: selective recalibration (papers/004) against recalibration alone and two rejection baselines.

    .venv/bin/python benchmarks/selective.py [--seeds 3] [--digits-seeds 10] [--quick]

First, the default options on the case they are held to (ALGORITHMS.md; tests/test_selective.py's
``DEFAULTS_CASE``): inliers (80%) with true posterior sigmoid(0.5 v), outliers with sigmoid(-2 v), v
the score's logit, ~ N(0, 2.5^2); 6 features (v / 2 and 5 coordinates in which the outliers sit 4
standard deviations away); beta 0.7; 4000 rows to fit, 50,000 to test, per seed. Every mode is run,
the default first, with recalibration alone (Platt on every row) beside it, and the same with a
narrower score spread (v ~ N(0, 1)), and with that spread and an inlier share of 0.72 (where Platt on every row is
nearly flat, so the selector trained against it learns little): the numbers the default mode was
chosen by. Bounds (tests/test_selective.py): ECE on accepted rows < 0.03, mean |p - p_true| there
below half recalibration alone's, coverage within 0.05 of beta.

Then two datasets, each fitted on a calibration set and measured on a separate test set:

* ``synthetic``: section 6's case (as in tests/test_selective.py): the classifier's logit z;
  inliers (80%) with true posterior sigmoid(0.5 z), outliers (20%) with the flipped
  sigmoid(-0.5 z), the same score distribution, and 4 features in which the outliers
  form a cluster 4 standard deviations away. 4000 rows to fit, 50,000 to test, per seed.
* ``digits``: scikit-learn's digits (1797 images, 10 classes). Per seed, a stratified
  split into 40% for the classifier, 30% to calibrate, 30% to test. The classifier,
  an MLPClassifier with one hidden layer of 32 ReLU units, is trained on clean images;
  in the calibration and test sets 30% of the images get Gaussian pixel noise (sd 6 on
  the 0..16 scale), a shift the classifier never saw. Scores are its 10 logits
  (``input="logit"``, temperature scaling); features are its 32 hidden activations.
  The test images are used 5 times, each time with a fresh draw of which 30% are noised
  and of the noise, so the test metrics rest on 5 x 540 rows.

Methods, each at target coverage beta = 0.5, 0.6, ..., 1.0: ``selective`` in both modes
(default options: hidden [64, 64], 100 epochs), recalibration alone (Platt or
temperature, no rejection), confidence-based rejection (the least confident
recalibrated predictions) and Isolation Forest rejection on the features (100
trees, random_state fixed); the baselines' thresholds accept a share beta of the
calibration set. ECE is of the positive class (synthetic) or top-label (digits), 15
equal-width bins; Brier is the mean squared error over classes. On the synthetic
case, where the true posterior is known, the mean |p - true posterior| on accepted
rows is also given. Every figure is the mean over seeds. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibd.calibration.platt import PlattCalibrator  # noqa: E402
from calibd.calibration.selective import MODES, Baselines, SelectiveCalibrator  # noqa: E402
from calibd.metrics import brier, ece  # noqa: E402
from tests.test_selective import DEFAULTS_BETA, DEFAULTS_CASE, section6  # noqa: E402  (the cases the tests assert on)

BETAS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
METHODS = (
    "selective (sequential)", "selective (refit)", "selective (joint)", "recalibration alone", "confidence rejection",
    "isolation forest",
)
BASELINE_KEYS = {
    "recalibration alone": "recalibration_alone",
    "confidence rejection": "confidence_rejection",
    "isolation forest": "isolation_forest",
}


def digits_split(seed: int, noise_share: float = 0.3, noise_sd: float = 6.0, test_draws: int = 5):
    """(calibration, test) sets of (logits, labels, hidden features, noisy flags) for one seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    train, rest = train_test_split(np.arange(y.shape[0]), train_size=0.4, stratify=y, random_state=seed)
    calibration, test = train_test_split(rest, train_size=0.5, stratify=y[rest], random_state=seed)
    classifier = MLPClassifier(hidden_layer_sizes=(32,), alpha=1e-4, max_iter=500, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning at max_iter: the classifier is good enough (~96%)
        classifier.fit(x[train] / 16.0, y[train])

    def shifted(rows):
        images = x[rows].copy()
        noisy = rng.uniform(size=rows.shape[0]) < noise_share
        images[noisy] += rng.normal(0.0, noise_sd, size=(int(noisy.sum()), images.shape[1]))
        hidden = np.maximum(images / 16.0 @ classifier.coefs_[0] + classifier.intercepts_[0], 0.0)
        logits = hidden @ classifier.coefs_[1] + classifier.intercepts_[1]
        return logits, y[rows], hidden, noisy

    # The test images are drawn 5 times (each draw noises a fresh 30% with fresh noise), so
    # that the test metrics rest on 2700 rows; the calibration set is drawn once.
    draws = [shifted(test) for _ in range(test_draws)]
    return shifted(calibration), tuple(np.concatenate(parts) for parts in zip(*draws))


def evaluate(probabilities, labels, accepted, outlier, truth=None) -> dict[str, float]:
    p, y = probabilities[accepted], labels[accepted]
    out = {"coverage": float(accepted.mean()), "ece": ece(p, y), "brier": brier(p, y), "outliers": float(outlier[accepted].mean())}
    if truth is not None:
        out["distance"] = float(np.abs(p - truth[accepted]).mean())
    return out


def run(
    fit_set, test_set, input: str, seeds_label: int, results: dict, times: dict, truth=None, options: dict | None = None
) -> None:
    """Fit every method at every beta on ``fit_set``, measure on ``test_set``; append to ``results``.

    The sets are (scores, labels, features, ..., outlier flags).
    """
    outlier = test_set[-1]
    scores, labels, features = fit_set[:3]
    test_scores, test_labels, test_features = test_set[:3]
    baselines = Baselines(scores, labels, np.ones(labels.shape[0]), input, features, seed=seeds_label)
    probabilities, confidence, typicality = baselines.predict(test_scores, test_features)
    for beta in BETAS:
        for name, accepted in baselines.accepted(beta, confidence, typicality).items():
            label = next(k for k, v in BASELINE_KEYS.items() if v == name)
            results.setdefault((label, beta), []).append(evaluate(probabilities, test_labels, accepted, outlier, truth))
        for mode in MODES:
            started = time.perf_counter()
            calibrator = SelectiveCalibrator(input=input, beta=beta, mode=mode, seed=seeds_label, **(options or {}))
            calibrator.fit(scores, labels, features=features)
            if beta < 1.0:
                times.setdefault(mode, []).append(time.perf_counter() - started)
            p, extras = calibrator.predict_details(test_scores, features=test_features)
            results.setdefault((f"selective ({mode})", beta), []).append(
                evaluate(p, test_labels, extras["accepted"], outlier, truth)
            )


def defaults_case(seeds: int, options: dict) -> None:
    """The default options (and each mode) on the case they are held to, and two variants."""
    default_mode = SelectiveCalibrator().mode
    modes = [default_mode] + [m for m in MODES if m != default_mode]
    variants = [("as held to (v ~ N(0, 2.5^2), inlier share 0.8)", {}), ("v ~ N(0, 1)", {"spread": 1.0}),
                ("v ~ N(0, 1), inlier share 0.72 (Platt on every row nearly flat)", {"spread": 1.0, "inlier_share": 0.72})]
    for title, change in variants:
        rows: dict[str, list] = {}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            scores, labels, features, _, _ = section6(4000, rng, **DEFAULTS_CASE, **change)
            test_scores, test_labels, test_features, truth, inlier = section6(50_000, rng, **DEFAULTS_CASE, **change)
            alone = PlattCalibrator().fit(scores, labels).predict(test_scores)
            alone_distance = float(np.abs(alone - truth).mean())
            rows.setdefault("recalibration alone", []).append((ece(alone, test_labels), alone_distance, alone_distance, 1.0, 0.0))
            for mode in modes:
                started = time.process_time()
                calibrator = SelectiveCalibrator(beta=DEFAULTS_BETA, mode=mode, seed=seed, **options)
                calibrator.fit(scores, labels, features=features)
                cpu = time.process_time() - started
                p, extras = calibrator.predict_details(test_scores, features=test_features)
                a = extras["accepted"]
                rows.setdefault(mode, []).append(
                    (ece(p[a], test_labels[a]), float(np.abs(p[a] - truth[a]).mean()), alone_distance, float(a.mean()), cpu)
                )
        print(f"**{title}**, {seeds} seeds, beta {DEFAULTS_BETA}\n")
        print("| fit | ECE on accepted (max) | mean abs(p - p_true) on accepted (max) | recalibration alone's (all rows) "
              "| ratio (max) | coverage (min, max) | CPU s per fit | bounds |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, values in rows.items():
            v = np.array(values)
            ratio = v[:, 1] / v[:, 2]
            ok = (v[:, 0] < 0.03).all() and (ratio < 0.5).all() and (np.abs(v[:, 3] - DEFAULTS_BETA) <= 0.05).all()
            label = f"selective, {name}" + (" (default)" if name == default_mode else "") if name in MODES else name
            bounds = "" if name not in MODES else ("met" if ok else "not met")
            print(
                f"| {label} | {v[:, 0].mean():.4f} ({v[:, 0].max():.4f}) | {v[:, 1].mean():.4f} ({v[:, 1].max():.4f}) | "
                f"{v[:, 2].mean():.4f} | {ratio.mean():.3f} ({ratio.max():.3f}) | {v[:, 3].mean():.3f} ({v[:, 3].min():.3f}, "
                f"{v[:, 3].max():.3f}) | {v[:, 4].mean():.2f} | {bounds} |"
            )
        print()


def table(results: dict, metric: str, title: str) -> str:
    lines = [f"**{title}**", "", "| method | " + " | ".join(f"β={b:.1f}" for b in BETAS) + " |", "|---|" + "---:|" * len(BETAS)]
    for method in METHODS:
        cells = []
        for beta in BETAS:
            values = [r[metric] for r in results[(method, beta)]]
            cells.append(f"{np.mean(values):.4f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="synthetic seeds")
    parser.add_argument("--digits-seeds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 seed each, small selector (a smoke test)")
    parser.add_argument("--defaults-seeds", type=int, default=4, help="seeds of the default-options case")
    parser.add_argument("--only-defaults", action="store_true", help="only the default-options case")
    args = parser.parse_args()
    options = {"hidden": [16], "epochs": 20} if args.quick else {}
    seeds = 1 if args.quick else args.seeds
    digits_seeds = 1 if args.quick else args.digits_seeds

    print(f"# Selective recalibration benchmark ({platform.processor() or platform.machine()}, numpy {np.__version__})\n")

    print(f"## Default options (mode `{SelectiveCalibrator().mode}`) on the case they are held to\n")
    defaults_case(1 if args.quick else args.defaults_seeds, options)
    if args.only_defaults:
        return

    results: dict = {}
    times: dict = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        fit_set = section6(4000, rng)
        scores, labels, features, truth, inlier = section6(50_000, rng)
        test_set = (scores, labels, features, truth, ~inlier)
        run(fit_set, test_set, "probability", seed, results, times, truth=test_set[3], options=options)
    print(f"## Synthetic (section 6), {seeds} seeds, 4000 rows fitted, 50,000 tested, true inlier share 0.8\n")
    print(table(results, "ece", "ECE (positive class) on accepted rows"), "\n")
    print(table(results, "brier", "Brier on accepted rows"), "\n")
    print(table(results, "distance", "mean |p - true posterior| on accepted rows"), "\n")
    print(table(results, "outliers", "share of outliers among accepted rows (0.2 among all)"), "\n")
    print(table(results, "coverage", "coverage reached on the test set"), "\n")
    print(
        "Fit seconds per selective fit (4000 rows, mean over betas < 1 and seeds): "
        + ", ".join(f"{mode} {np.mean(values):.2f}" for mode, values in times.items())
        + "\n"
    )

    results, times = {}, {}
    noisy_shares = []
    for seed in range(digits_seeds):
        calibration, test = digits_split(seed)
        noisy_shares.append(test[3].mean())
        run(calibration, test, "logit", seed, results, times, options=options)
    print(
        f"## digits, {digits_seeds} seeds: MLPClassifier(32) trained on clean images; 30% of the calibration "
        f"({calibration[1].shape[0]} rows) and test ({test[1].shape[0]} rows: 5 noise draws) images noised\n"
    )
    print(table(results, "ece", "top-label ECE on accepted rows"), "\n")
    print(table(results, "brier", "Brier on accepted rows"), "\n")
    print(table(results, "outliers", f"share of noised images among accepted rows ({np.mean(noisy_shares):.2f} among all)"), "\n")
    print(table(results, "coverage", "coverage reached on the test set"), "\n")
    print(
        f"Fit seconds per selective fit ({calibration[1].shape[0]} rows, 32 features, 10 classes): "
        + ", ".join(f"{mode} {np.mean(values):.2f}" for mode, values in times.items())
    )


if __name__ == "__main__":
    main()
