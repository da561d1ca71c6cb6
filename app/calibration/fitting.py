"""One fit, as the service runs it: validate, fit, summarise, fingerprint.

``fit_calibrator`` is what ``POST /calibrators`` calls, and what a notebook can
call to get the same calibrator and the same summary.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..metrics import evaluate, prepare
from ..metrics.binned import DEFAULT_N_BINS, ece_prepared
from ..metrics.scores import brier_prepared, log_loss_prepared
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import to_probability
from .validation import check_arrays, n_classes_of
from .crossfit import CROSS_FIT_SEED, CROSS_FIT_SPLITS, cross_val_predict_details, stratified_folds
from .registry import get_method

#: Above this many rows, the summary's full evaluation (``holdout``: every metric and the
#: reliability diagram) is of a seeded uniform subsample of this many rows, the same rows
#: before and after; the headline ``before``/``after`` metrics are of every row. Several of
#: those metrics sort or bin the rows a few times each (about 8 CPU seconds at 5 million rows).
SUMMARY_EVALUATE_ROWS = 200_000
SUMMARY_EVALUATE_SEED = 0


@dataclass
class FitResult:
    calibrator: Calibrator
    summary: dict[str, Any]
    n_samples: int
    holdout_sha256: str
    fit_seconds: float
    #: Class names, in score-column order, when the labels were strings.
    classes: list[Any] | None = None


def summary_metrics(probabilities: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """The metrics every fit summary reports, before and after calibration.

    ECE is of the positive class for binary probabilities and top-label for rows.
    """
    data = prepare(probabilities, labels, weights)  # validated once for the three
    target = "binary" if data.binary else "top_label"
    return {
        "ece": ece_prepared(data, DEFAULT_N_BINS, "uniform", "l1", target),
        "brier": brier_prepared(data),
        "log_loss": log_loss_prepared(data),
    }


def holdout_evaluation(before: np.ndarray, after: np.ndarray, labels: np.ndarray, weights: np.ndarray | None) -> dict[str, Any]:
    """``evaluate`` before and after, as ``POST /evaluate`` gives it, on at most
    SUMMARY_EVALUATE_ROWS rows (a seeded uniform draw without replacement, in row order)."""
    evaluated, rows_used, subsample = evaluate_subsample(before, labels, weights)
    return {"before": evaluated, "after": evaluate_subsample(after, labels, weights)[0], "rows_used": rows_used, "subsample": subsample}


def evaluate_subsample(probabilities: np.ndarray, labels: np.ndarray, weights: np.ndarray | None) -> tuple[dict[str, Any], int, dict | None]:
    """One side of ``holdout_evaluation``: (``evaluate`` of the rows, how many, the subsample's description)."""
    n = labels.shape[0]
    subsample = None
    if n > SUMMARY_EVALUATE_ROWS:
        rows = np.sort(np.random.default_rng(SUMMARY_EVALUATE_SEED).choice(n, SUMMARY_EVALUATE_ROWS, replace=False))
        probabilities, labels = probabilities[rows], labels[rows]
        weights = None if weights is None else weights[rows]
        subsample = {"rows": n, "seed": SUMMARY_EVALUATE_SEED, "draw": "uniform without replacement"}
    return evaluate(probabilities, labels, weights), int(labels.shape[0]), subsample


def raw_probabilities(scores: np.ndarray, input: str, calibrator: Calibrator) -> np.ndarray:
    """What the scores say before calibration, as probabilities: the softmax of logit
    rows (multiclass), the average of the M classifiers' probabilities (multivariate)."""
    if scores.ndim == 1:
        return to_probability(scores, input)
    if "multivariate" in calibrator.tasks:
        return to_probability(scores, input).mean(axis=1)
    if input == "probability":
        return scores
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def holdout_fingerprint(
    scores: np.ndarray, labels: np.ndarray, sample_weight: np.ndarray | None, arrays: dict[str, np.ndarray] | None = None
) -> str:
    """sha256 of the holdout: float64 scores, int64 labels, float64 weights, then any
    extra arrays by name (all little-endian, each preceded by its shape)."""
    digest = hashlib.sha256()
    digest.update(repr(scores.shape).encode())
    digest.update(np.ascontiguousarray(scores, dtype="<f8"))  # the buffer itself, not a copy
    digest.update(np.ascontiguousarray(labels, dtype="<i8"))
    if sample_weight is not None:
        digest.update(np.ascontiguousarray(sample_weight, dtype="<f8"))
    for name in sorted(arrays or {}):
        digest.update(f"{name}{arrays[name].shape}".encode())
        if hasattr(arrays[name], "digest"):  # named columns (calibd.calibration.columns)
            digest.update(arrays[name].digest())
        else:
            digest.update(np.ascontiguousarray(arrays[name], dtype="<f8"))
    return digest.hexdigest()


def fit_calibrator(
    method: str,
    input: str,
    options: dict[str, Any] | None,
    scores: Any,
    labels: Any,
    sample_weight: Any = None,
    classes: list[Any] | None = None,
    arrays: dict[str, Any] | None = None,
    max_samples: int | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> FitResult:
    """Fit ``method`` on the holdout and summarise it with cross-fitted metrics.

    ``progress(fraction, stage)``, if given, is called as the work advances.

    ``after`` comes from 5-fold out-of-fold predictions: each row is scored by a
    calibrator fitted without it (for ``auto``, the chosen method's, reused from
    the choice; see ``auto``). ``fit_seconds`` is the whole time, validation
    included; ``summary.timings`` splits it into ``validate``, ``fit`` (the
    calibrator served), ``cross_fit`` (the 5 folds' refits, or none where the fit
    kept its own out-of-fold predictions) and ``summary`` (the metrics); the
    service adds ``parse`` (reading the request body).
    """
    report = progress or (lambda fraction, stage: None)
    report(0.0, "validating")
    started = time.perf_counter()
    calibrator = get_method(method).from_options(input, options)
    scores, labels, weights, names = calibrator.check_holdout_arrays(scores, labels, sample_weight, classes, max_samples)
    extras = check_arrays(arrays or {}, calibrator.fit_arrays, scores.shape[0])
    raw = raw_probabilities(scores, input, calibrator)
    given_weights = None if sample_weight is None else weights
    # What does not depend on the fit runs beside it, on a second thread (hashing and
    # numpy release the GIL): the cross-fit's folds first, then the metrics before
    # calibration. The fingerprint follows the fit, on whichever thread is free first.
    with ThreadPoolExecutor(max_workers=1) as beside:
        folds = beside.submit(stratified_folds, labels, CROSS_FIT_SPLITS, CROSS_FIT_SEED)
        before = beside.submit(lambda: (summary_metrics(raw, labels, given_weights), evaluate_subsample(raw, labels, given_weights)))
        report(0.05, "fitting")
        fit_started = time.perf_counter()
        calibrator._fit(scores, labels, weights, **extras)
        calibrator.n_classes_ = n_classes_of(scores, calibrator.tasks)
        try:  # the checks an imported calibrator must pass too
            calibrator.check_state()
        except CalibrationInputError as error:
            raise CalibrationInputError("scores", f"the fit on this holdout gives an unusable calibrator ({error})") from None
        summary_started = time.perf_counter()
        if folds.done():  # a long fit: the second thread is free sooner
            fingerprint = beside.submit(holdout_fingerprint, scores, labels, given_weights, extras)
        else:  # this thread would only wait for the folds
            fingerprint = holdout_fingerprint(scores, labels, given_weights, extras)
        report(0.2, "cross-fitting")
        out_of_fold, out_of_fold_extras = cross_val_predict_details(
            calibrator, scores, labels, weights, CROSS_FIT_SPLITS, CROSS_FIT_SEED, folds=folds.result(), arrays=extras,
            on_fold=lambda k, n: report(0.2 + 0.65 * k / n, f"cross-fitted fold {k} of {n}"),
        )
        reused = out_of_fold is getattr(getattr(calibrator, "out_of_fold_", None), "predictions", None)
        cross_fit_done = time.perf_counter()
        report(0.85, "evaluating")
        # The method's own items first: they may replace the fit after seeing its cross-fitted
        # figures (selective's guard), and then describe what is served in ``out_of_fold``.
        method_summary = calibrator.cross_fit_summary(out_of_fold, out_of_fold_extras, scores, labels, weights, extras)
        evaluated_after = beside.submit(evaluate_subsample, out_of_fold, labels, given_weights)
        after = summary_metrics(out_of_fold, labels, given_weights)
        before_metrics, (evaluated_before, rows_used, subsample) = before.result()
        evaluated_after = evaluated_after.result()[0]
        if not isinstance(fingerprint, str):
            fingerprint = fingerprint.result()
    summary = {
        "before": before_metrics,
        "after": after,
        # Every metric and the reliability diagram, as POST /evaluate gives them, for reports.
        "holdout": {"before": evaluated_before, "after": evaluated_after, "rows_used": rows_used, "subsample": subsample},
        "cross_fit": {
            "n_splits": CROSS_FIT_SPLITS,
            "seed": CROSS_FIT_SEED,
            "of": "the chosen method, reused from the choice (made on the same folds)" if reused else "the whole fit",
        },
        "fit": calibrator.fit_info(),
        **method_summary,
    }
    finished = time.perf_counter()
    summary["timings"] = {
        "validate": fit_started - started,
        "fit": summary_started - fit_started,
        "cross_fit": cross_fit_done - summary_started,
        "summary": finished - cross_fit_done,
    }
    return FitResult(
        calibrator=calibrator,
        summary=summary,
        n_samples=int(scores.shape[0]),
        holdout_sha256=fingerprint,
        fit_seconds=finished - started,
        classes=names,
    )
