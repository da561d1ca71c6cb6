"""Automatic method choice by cross-validated log-loss.

Every candidate method is fitted K times on K-1 folds of the holdout and
scored on the fold it did not see; the candidate with the lowest mean
out-of-fold log-loss is refitted on the whole holdout. The per-candidate
scores are kept, so the choice can be explained.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import log_loss
from .base import Calibrator, CalibrationInputError, n_classes_of
from .crossfit import cross_val_predict, stratified_folds

DEFAULT_CANDIDATES = ("platt", "temperature", "beta", "isotonic", "histogram", "venn_abers", "scaling_binning")
MULTICLASS_CANDIDATES = (
    "temperature", "vector", "matrix", "dirichlet", "ovr_platt", "ovr_isotonic", "top_label_histogram",
)


def _registry() -> dict[str, type[Calibrator]]:
    from .registry import METHODS  # the registry imports this module

    return METHODS


class AutoCalibrator(Calibrator):
    """Pick the candidate method with the best cross-validated log-loss.

    Options:
        candidates: method names to choose among (default: every method for the
            kind of scores given, binary or multiclass). Candidates that cannot
            fit the holdout (a full matrix for too many classes, say) are
            skipped, and the reason recorded.
        n_splits: folds of the selection cross-validation (default 5).
        seed: fold assignment seed.
    """

    method = "auto"
    tasks = ("binary", "multiclass")
    # Every candidate is cross-validated, and the summary cross-fits the whole choice.
    max_samples = 1_000_000
    fitted_attributes = ("chosen_", "cv_log_loss_", "skipped_", "calibrator_")

    def __init__(self, input: str = "probability", candidates: list[str] | None = None, n_splits: int = 5, seed: int = 0):
        self.input = input
        self.candidates = candidates
        self.n_splits = n_splits
        self.seed = seed

    @property
    def monotone(self) -> bool:  # type: ignore[override]
        """Monotone exactly when the chosen method is."""
        return hasattr(self, "calibrator_") and self.calibrator_.monotone

    @property
    def min_samples(self) -> int:  # type: ignore[override]
        return max(10, 2 * self.n_splits)

    def _candidate_names(self, multiclass: bool) -> list[str]:
        if self.candidates is not None:
            return list(self.candidates)
        return list(MULTICLASS_CANDIDATES if multiclass else DEFAULT_CANDIDATES)

    def _check_params(self) -> None:
        if self.candidates is not None:
            if not isinstance(self.candidates, list) or not self.candidates:
                raise CalibrationInputError("options.candidates", "must be a non-empty list of method names")
            methods = _registry()
            for i, name in enumerate(self.candidates):
                takes_scores_alone = name in methods and not any(s.required for s in methods[name].fit_arrays.values())
                if name not in methods or name == "auto" or not takes_scores_alone:
                    known = ", ".join(dict.fromkeys(DEFAULT_CANDIDATES + MULTICLASS_CANDIDATES))
                    raise CalibrationInputError("options.candidates", f"unknown candidate {name!r} (known: {known})", (i,))
        if not isinstance(self.n_splits, int) or isinstance(self.n_splits, bool) or not 2 <= self.n_splits <= 20:
            raise CalibrationInputError("options.n_splits", "must be an integer from 2 to 20")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise CalibrationInputError("options.seed", "must be an integer")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        methods = _registry()
        multiclass = scores.ndim == 2
        task = "multiclass" if multiclass else "binary"
        folds = stratified_folds(labels, self.n_splits, self.seed)
        self.cv_log_loss_ = {}
        self.skipped_ = {}
        for name in self._candidate_names(multiclass):
            candidate = methods[name](input=self.input)
            if self.input not in candidate.inputs or task not in candidate.tasks:
                self.skipped_[name] = f"takes no {task} {self.input} scores"
                continue
            try:
                oof = cross_val_predict(candidate, scores, labels, weights, self.n_splits, folds=folds)
            except CalibrationInputError as error:  # e.g. a full matrix for too many classes
                self.skipped_[name] = error.detail
                continue
            self.cv_log_loss_[name] = log_loss(oof, labels, weights)
        if not self.cv_log_loss_:
            raise CalibrationInputError("options.candidates", f"no candidate can fit these scores: {self.skipped_}")
        self.chosen_ = min(self.cv_log_loss_, key=self.cv_log_loss_.get)
        self.calibrator_ = methods[self.chosen_](input=self.input)
        self.calibrator_._fit(scores, labels, weights)
        self.calibrator_.n_classes_ = n_classes_of(scores, self.calibrator_.tasks)

    def prepare(self) -> None:
        self.calibrator_.prepare()

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return self.calibrator_._predict(scores)

    def _predict_details(self, scores: np.ndarray, **arrays: Any):
        return self.calibrator_._predict_details(scores, **arrays)

    def fit_info(self) -> dict:
        return {
            "chosen": self.chosen_,
            "reason": f"lowest {self.n_splits}-fold cross-validated log-loss",
            "cv_log_loss": self.cv_log_loss_,
            "skipped": self.skipped_,
            "chosen_fit": self.calibrator_.fit_info(),
        }

    def _check_state(self) -> None:
        # The chosen calibrator is checked as an attribute (``check_state``); it must be the one named.
        if getattr(self.calibrator_, "method", None) != self.chosen_:
            raise CalibrationInputError("state.chosen_", "must name the method of the stored calibrator_")

    def to_dict(self) -> dict[str, Any]:
        self._check_fitted()
        state = {
            "chosen_": self.chosen_,
            "cv_log_loss_": self.cv_log_loss_,
            "skipped_": self.skipped_,
            "calibrator_": self.calibrator_.to_dict(),
        }
        return {"method": self.method, "params": self.get_params(), "n_classes": getattr(self, "n_classes_", 2), "state": state}

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> AutoCalibrator:
        from .registry import from_dict

        calibrator = cls(**params)
        calibrator.chosen_ = state["chosen_"]
        calibrator.cv_log_loss_ = dict(state["cv_log_loss_"])
        calibrator.skipped_ = dict(state.get("skipped_", {}))
        calibrator.calibrator_ = from_dict(state["calibrator_"])
        calibrator.n_classes_ = 2
        return calibrator
