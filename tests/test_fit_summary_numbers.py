"""The fit summary's numbers against plain reference forms, exactly: fold assignment,
the binary log loss and the headline metrics (their faster forms must give the same floats)."""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration.crossfit import stratified_folds
from calibd.calibration.fitting import summary_metrics
from calibd.metrics import brier, ece, log_loss
from calibd.metrics.scores import LOG_LOSS_EPS


def reference_folds(labels: np.ndarray, n_splits: int, seed: int) -> np.ndarray:
    """Each class's rows shuffled by one seeded Generator, dealt round-robin on from where the previous class stopped."""
    rng = np.random.default_rng(seed)
    folds = np.empty(labels.shape[0], dtype=np.int64)
    offset = 0
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        folds[members] = (np.arange(members.shape[0]) + offset) % n_splits
        offset += members.shape[0]
    return folds


@pytest.mark.parametrize("n_classes", [1, 2, 3, 10])
@pytest.mark.parametrize("n_splits", [2, 5, 7])
@pytest.mark.parametrize("seed", [0, 3])
def test_stratified_folds_match_the_reference(n_classes, n_splits, seed):
    rng = np.random.default_rng(seed + 17)
    for labels in (
        rng.integers(0, n_classes, 20_011),
        rng.integers(0, n_classes, 20_011).astype(np.int8),
        np.where(rng.integers(0, n_classes, 5_003) == 0, n_classes + 4, 0),  # a class number skipped
        rng.integers(0, n_classes, 20_011).astype(np.float64),  # not integers: the sorting path
    ):
        folds = stratified_folds(labels, n_splits, seed)
        assert folds.dtype == np.int64
        np.testing.assert_array_equal(folds, reference_folds(labels, n_splits, seed))


def test_binary_log_loss_is_the_mean_of_each_rows_term():
    rng = np.random.default_rng(4)
    p = rng.uniform(size=300_001)
    p[:100], p[100:200] = 0.0, 1.0  # clipped
    labels = (rng.uniform(size=p.shape[0]) < p).astype(np.int64)
    q = np.clip(p, LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS)
    expected = -float(np.where(labels == 1, np.log(q), np.log1p(-q)).mean())
    assert log_loss(p, labels) == expected
    weights = rng.uniform(0.1, 3.0, p.shape[0])
    per_row = np.where(labels == 1, np.log(q), np.log1p(-q))
    assert log_loss(p, labels, weights) == -float(np.dot(weights, per_row) / weights.sum())


@pytest.mark.parametrize("weighted", [False, True])
def test_summary_metrics_are_the_metrics_one_by_one(weighted):
    rng = np.random.default_rng(5)
    p = rng.uniform(size=50_000)
    labels = (rng.uniform(size=p.shape[0]) < p**2).astype(np.int64)
    weights = rng.uniform(0.5, 2.0, p.shape[0]) if weighted else None
    assert summary_metrics(p, labels, weights) == {
        "ece": ece(p, labels, sample_weight=weights, target="binary"),
        "brier": brier(p, labels, weights),
        "log_loss": log_loss(p, labels, weights),
    }
    rows = rng.dirichlet(np.ones(4), 20_000)
    classes = rng.integers(0, 4, rows.shape[0])
    assert summary_metrics(rows, classes, None) == {
        "ece": ece(rows, classes, target="top_label"),
        "brier": brier(rows, classes),
        "log_loss": log_loss(rows, classes),
    }
