"""Cross-fitting: out-of-fold predictions, so that no row is scored by a
calibrator that saw it.

A calibrator evaluated on its own holdout looks better than it is (isotonic
regression is exactly calibrated in-sample), so fit summaries and method
selection use K-fold out-of-fold predictions instead.
"""

from __future__ import annotations

import numpy as np

from .base import Calibrator


def stratified_folds(labels: np.ndarray, n_splits: int = 5, seed: int = 0) -> np.ndarray:
    """A fold number in 0..n_splits-1 per row, each class spread evenly over the folds."""
    rng = np.random.default_rng(seed)
    folds = np.empty(labels.shape[0], dtype=np.int64)
    offset = 0
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        # Continue the round-robin where the previous class stopped, so that
        # fold sizes differ by at most one overall.
        folds[members] = (np.arange(members.shape[0]) + offset) % n_splits
        offset += members.shape[0]
    return folds


def clone(calibrator: Calibrator) -> Calibrator:
    """An unfitted calibrator with the same options."""
    return type(calibrator)(**calibrator.get_params())


def cross_val_predict(
    calibrator: Calibrator,
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    n_splits: int = 5,
    seed: int = 0,
    folds: np.ndarray | None = None,
) -> np.ndarray:
    """Out-of-fold calibrated probabilities of class 1 for validated arrays.

    Each fold is predicted by a fresh clone fitted on the other folds. With
    stratified folds and at least two rows of each class, every training part
    holds both classes.
    """
    if folds is None:
        folds = stratified_folds(labels, n_splits, seed)
    out = np.empty(scores.shape[0], dtype=np.float64)
    for fold in range(n_splits):
        test = folds == fold
        if not test.any():
            continue
        train = ~test
        model = clone(calibrator)
        model._fit(scores[train], labels[train], weights[train])
        out[test] = model._predict(scores[test])
    return out
