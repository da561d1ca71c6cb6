"""Cross-fitting: out-of-fold predictions, so that no row is scored by a
calibrator that saw it.

A calibrator evaluated on its own holdout looks better than it is (isotonic
regression is exactly calibrated in-sample), so fit summaries and method
selection use K-fold out-of-fold predictions instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .base import Calibrator

#: The folds of every fit summary (``fitting.fit_calibrator``) and of the
#: baselines a method cross-fits beside it.
CROSS_FIT_SPLITS = 5
CROSS_FIT_SEED = 0


def stratified_folds(labels: np.ndarray, n_splits: int = 5, seed: int = 0) -> np.ndarray:
    """A fold number in 0..n_splits-1 per row, each class spread evenly over the folds."""
    rng = np.random.default_rng(seed)
    # Filled through the smallest integer type (the scattered writes land in less memory), returned as int64.
    folds = np.empty(labels.shape[0], dtype=np.min_scalar_type(max(n_splits - 1, 0)))
    offset = 0
    # Row numbers as int32 where they fit: the shuffle (the costly part at millions of rows,
    # a random swap per row) touches half the memory, and draws the same permutation.
    index = np.int32 if labels.shape[0] <= np.iinfo(np.int32).max else np.int64
    for label in _classes(labels):
        members = np.flatnonzero(labels == label).astype(index)
        rng.shuffle(members)
        # Continue the round-robin where the previous class stopped, so that
        # fold sizes differ by at most one overall.
        folds[members] = (np.arange(members.shape[0]) + offset) % n_splits
        offset += members.shape[0]
    return folds.astype(np.int64)


def _classes(labels: np.ndarray) -> np.ndarray:
    """``np.unique(labels)``; for small non-negative integers by counting, without its sort."""
    if labels.dtype.kind in "iu" and labels.shape[0] and 0 <= labels.min() and labels.max() < 1 << 16:
        return np.flatnonzero(np.bincount(labels))
    return np.unique(labels)


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
    arrays: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Out-of-fold calibrated probabilities; see ``cross_val_predict_details``."""
    return cross_val_predict_details(calibrator, scores, labels, weights, n_splits, seed, folds, arrays)[0]


@dataclass
class OutOfFold:
    """Out-of-fold predictions a fit already made, and the folds they were made on.

    A calibrator whose fit cross-validates itself (``auto``: the chosen candidate's
    predictions from the selection) keeps one as ``out_of_fold_``;
    ``cross_val_predict_details`` returns it instead of refitting when asked for the
    same folds.
    """

    folds: np.ndarray
    predictions: np.ndarray
    details: dict[str, np.ndarray] = field(default_factory=dict)


def cross_val_predict_details(
    calibrator: Calibrator,
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    n_splits: int = 5,
    seed: int = 0,
    folds: np.ndarray | None = None,
    arrays: dict[str, np.ndarray] | None = None,
    on_fold: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Out-of-fold calibrated probabilities, and per-row extras, for validated arrays.

    Each fold is predicted by a fresh clone fitted on the other folds. With
    stratified folds and at least two rows of each class, every training part
    holds both classes. Extra ``arrays`` declared row-aligned are split with
    the rows; the others go whole to every fit. A fitted calibrator's own
    ``out_of_fold_`` (``OutOfFold``) on the same folds is returned as it is.
    """
    arrays = arrays or {}
    if folds is None:
        folds = stratified_folds(labels, n_splits, seed)
    cached = getattr(calibrator, "out_of_fold_", None)
    if isinstance(cached, OutOfFold) and np.array_equal(cached.folds, folds):
        if on_fold is not None:
            on_fold(n_splits, n_splits)
        return cached.predictions, cached.details
    # A method that can cross-fit without refitting from scratch (isotonic: one sort for every fold).
    shortcut = getattr(calibrator, "cross_val_predictions", None)
    if shortcut is not None and not arrays:
        out = shortcut(scores, labels, weights, folds, n_splits)
        if on_fold is not None:
            on_fold(n_splits, n_splits)
        return out, {}
    out = None
    extras: dict[str, np.ndarray] = {}
    for fold in range(n_splits):
        part = fit_fold(calibrator, scores, labels, weights, folds, fold, arrays)
        if part is None:
            continue
        test, predicted, details = part
        if out is None:
            out = np.empty((scores.shape[0], *predicted.shape[1:]), dtype=np.float64)
        out[test] = predicted
        for key, value in details.items():
            if key not in extras:
                extras[key] = np.empty((scores.shape[0], *value.shape[1:]), dtype=value.dtype)
            extras[key][test] = value
        if on_fold is not None:
            on_fold(fold + 1, n_splits)
    return out, extras


def fit_fold(
    calibrator: Calibrator,
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    folds: np.ndarray,
    fold: int,
    arrays: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """(test mask, predictions, extras) of a clone fitted without fold ``fold``; None if the fold is empty."""
    arrays = arrays or {}
    test = folds == fold
    if not test.any():
        return None
    train = ~test
    model = clone(calibrator)
    model._fit(scores[train], labels[train], weights[train], **_split(arrays, calibrator.fit_arrays, train))
    predicted, details = model._predict_details(
        scores[test], **_split(arrays, calibrator.predict_arrays, test, only_declared=True)
    )
    return test, predicted, details


def _split(arrays: dict[str, np.ndarray], specs: dict, rows: np.ndarray, only_declared: bool = False) -> dict[str, np.ndarray]:
    """The arrays a fit or predict takes, row-aligned ones restricted to ``rows``."""
    chosen = {}
    for name, array in arrays.items():
        spec = specs.get(name)
        if spec is None:
            if only_declared:
                continue
            raise KeyError(name)
        chosen[name] = array[rows] if spec.rows else array
    return chosen
