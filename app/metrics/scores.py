"""Proper scoring rules for binary probabilities."""

from __future__ import annotations

import numpy as np

# Probabilities are clipped to [LOG_LOSS_EPS, 1 - LOG_LOSS_EPS] so that a
# confident miss costs a large finite amount, as in scikit-learn's log_loss.
LOG_LOSS_EPS = 1e-15


def _weights(sample_weight, n: int) -> np.ndarray:
    return np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)


def brier(probabilities, labels, sample_weight=None) -> float:
    """Mean squared error of the probability of class 1: sum w (p - y)^2 / sum w."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    w = _weights(sample_weight, p.shape[0])
    return float(np.dot(w, (p - y) ** 2) / w.sum())


def log_loss(probabilities, labels, sample_weight=None) -> float:
    """Mean negative log-likelihood: -sum w [y log p + (1 - y) log(1 - p)] / sum w."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS)
    y = np.asarray(labels, dtype=np.float64)
    w = _weights(sample_weight, p.shape[0])
    return float(-np.dot(w, y * np.log(p) + (1.0 - y) * np.log1p(-p)) / w.sum())
