"""One fit, as the service runs it: validate, fit, summarise, fingerprint.

``fit_calibrator`` is what ``POST /calibrators`` calls, and what a notebook can
call to get the same calibrator and the same summary.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..metrics import brier, ece, log_loss
from .base import Calibrator, check_binary_labels, check_holdout, check_sample_weight, check_scores, to_probability
from .crossfit import cross_val_predict
from .registry import get_method

CROSS_FIT_SPLITS = 5
CROSS_FIT_SEED = 0


@dataclass
class FitResult:
    calibrator: Calibrator
    summary: dict[str, Any]
    n_samples: int
    holdout_sha256: str
    fit_seconds: float


def summary_metrics(probabilities: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """The metrics every fit summary reports, before and after calibration."""
    return {
        "ece": ece(probabilities, labels, sample_weight=weights),
        "brier": brier(probabilities, labels, weights),
        "log_loss": log_loss(probabilities, labels, weights),
    }


def holdout_fingerprint(scores: np.ndarray, labels: np.ndarray, sample_weight: np.ndarray | None) -> str:
    """sha256 of the holdout as float64 scores, int64 labels and float64 weights (little-endian)."""
    digest = hashlib.sha256()
    digest.update(repr(scores.shape).encode())
    digest.update(np.ascontiguousarray(scores, dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    if sample_weight is not None:
        digest.update(np.ascontiguousarray(sample_weight, dtype="<f8").tobytes())
    return digest.hexdigest()


def fit_calibrator(
    method: str,
    input: str,
    options: dict[str, Any] | None,
    scores: Any,
    labels: Any,
    sample_weight: Any = None,
) -> FitResult:
    """Fit ``method`` on the holdout and summarise it with cross-fitted metrics.

    ``after`` comes from 5-fold out-of-fold predictions: each row is scored by a
    calibrator fitted without it.
    """
    calibrator = get_method(method).from_options(input, options)
    scores = check_scores(scores, input)
    labels = check_binary_labels(labels, scores.shape[0])
    weights = check_sample_weight(sample_weight, scores.shape[0])
    check_holdout(labels, weights, calibrator.min_samples)
    started = time.perf_counter()
    calibrator._fit(scores, labels, weights)
    calibrator.n_classes_ = 2
    fit_seconds = time.perf_counter() - started
    out_of_fold = cross_val_predict(calibrator, scores, labels, weights, CROSS_FIT_SPLITS, CROSS_FIT_SEED)
    summary = {
        "before": summary_metrics(to_probability(scores, input), labels, weights),
        "after": summary_metrics(out_of_fold, labels, weights),
        "cross_fit": {"n_splits": CROSS_FIT_SPLITS, "seed": CROSS_FIT_SEED},
        "fit": calibrator.fit_info(),
    }
    return FitResult(
        calibrator=calibrator,
        summary=summary,
        n_samples=int(scores.shape[0]),
        holdout_sha256=holdout_fingerprint(scores, labels, None if sample_weight is None else weights),
        fit_seconds=fit_seconds,
    )
