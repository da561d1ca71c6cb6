"""Automatic method choice by cross-validated log-loss.

Every candidate method is fitted K times on K-1 folds of the holdout and
scored on the fold it did not see; the candidate with the lowest mean
out-of-fold log-loss is refitted on the whole holdout. The per-candidate
scores are kept, so the choice can be explained.

Cost. The K x K candidates (``matrix``, ``dirichlet``) dominate at many
classes (about 2 s of CPU per fit at K = 100 on 16,000 rows). So:

* candidates that are the same model on the input are fitted once: on
  probability input, ``matrix`` maps log p, and ``dirichlet`` (full, ODIR, the
  same strengths) maps log p too, so the second gets the first's out-of-fold
  predictions and score (``fit_info()["same_model_as"]``; the choice keeps the
  first listed on a tie). On logit input they differ (log softmax(z) is z
  shifted per row, which W does not ignore), and both are fitted;
* the candidates' fold fits run on up to ``MAX_THREADS`` threads (numpy
  releases the GIL in its products), BLAS held to one thread each;
* the chosen candidate's out-of-fold predictions are kept (``out_of_fold_``,
  not stored), so the fit summary, which cross-fits on the same folds with
  the default ``n_splits`` and ``seed``, reuses them instead of rerunning the
  choice in each fold. Those are exactly the chosen method's cross-fitted
  predictions; the choice among the candidates was made on the same rows,
  which the summary states (``cross_fit.of``). With other folds the summary
  cross-fits the whole choice, nested, as for any method.

Extra arrays. ``auto`` takes every array its candidates declare (``features``
for ``multicalibration``), all optional, and gives each candidate the ones it
declares, in the selection's folds, in the final fit and at predict time. By
default, ``multicalibration`` joins the binary candidates when ``features`` is
given (``ARRAY_CANDIDATES``); a listed candidate whose arrays are not given fits
on the scores alone.
"""

from __future__ import annotations

import os
from dataclasses import replace
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np

from ..metrics import log_loss
from ._threads import single_threaded_blas
from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import ArraySpec, n_classes_of
from .crossfit import OutOfFold, fit_fold, stratified_folds
from .linear import LinearCalibrator

DEFAULT_CANDIDATES = ("platt", "temperature", "beta", "isotonic", "histogram", "venn_abers", "scaling_binning")
MULTICLASS_CANDIDATES = (
    "temperature", "vector", "matrix", "dirichlet", "ovr_platt", "ovr_isotonic", "top_label_histogram",
)
#: Default candidates that need an extra array: each joins when the arrays it declares are given.
ARRAY_CANDIDATES = {"binary": ("multicalibration",), "multiclass": ()}
#: Threads for the candidates' fold fits (at most; never more than the CPUs this process may use).
MAX_THREADS = 4


def available_threads() -> int:
    """min(MAX_THREADS, the CPUs this process may run on)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cpus))


def model_key(candidate: Calibrator) -> tuple | None:
    """Equal for two candidates that fit the same model to the same inputs (None: no known twin).

    The linear maps are the same model when they map the same features (log p on
    probability input, whichever the method) with the same variant, penalty and
    optimiser settings.
    """
    if not isinstance(candidate, LinearCalibrator):
        return None
    space = "log_probability" if candidate.input == "probability" else candidate.features
    return (
        "linear", space, candidate.variant, candidate.regularization, candidate.reg_lambda,
        float(candidate.reg_mu), int(candidate.max_iter),
    )


def arrays_for(calibrator: Calibrator, arrays: dict[str, Any]) -> dict[str, Any]:
    """The given arrays that ``calibrator``'s fit declares."""
    return {name: value for name, value in arrays.items() if name in calibrator.fit_arrays}


def cross_validate(
    candidates: list[tuple[str, Calibrator]],
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    folds: np.ndarray,
    threads: int = 1,
    arrays: dict[str, Any] | None = None,
) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]] | CalibrationInputError]:
    """Each candidate's out-of-fold (predictions, extras), or the input error one of its fits raised.

    The (candidate, fold) fits are independent and each gets a fresh clone; they run
    on ``threads`` threads, and the result does not depend on how many. Each
    candidate gets the validated ``arrays`` it declares.
    """
    n_splits = int(folds.max()) + 1
    tasks = [(name, candidate, fold) for name, candidate in candidates for fold in range(n_splits)]

    def run(task: tuple[str, Calibrator, int]) -> Any:
        _, candidate, fold = task
        try:
            return fit_fold(candidate, scores, labels, weights, folds, fold, arrays_for(candidate, arrays or {}))
        except CalibrationInputError as error:  # e.g. a full matrix for too many classes
            return error

    if threads > 1:
        with single_threaded_blas(), ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(run, tasks))
    else:
        parts = [run(task) for task in tasks]
    results: dict[str, Any] = {}
    for (name, _, _), part in zip(tasks, parts):
        if part is None or isinstance(results.get(name), CalibrationInputError):
            continue
        if isinstance(part, CalibrationInputError):
            results[name] = part
            continue
        test, predicted, details = part
        if name not in results:
            results[name] = (
                np.empty((scores.shape[0], *predicted.shape[1:]), dtype=np.float64),
                {key: np.empty((scores.shape[0], *value.shape[1:]), dtype=value.dtype) for key, value in details.items()},
            )
        out, extras = results[name]
        out[test] = predicted
        for key, value in details.items():
            extras[key][test] = value
    return results


def declared_arrays(methods: Mapping[str, type[Calibrator]], names: list[str] | None, kind: str) -> dict[str, ArraySpec]:
    """The arrays (``kind``: fit_arrays or predict_arrays) the candidates ``names`` declare
    (None: every default candidate), each optional; the first declaration of a name wins."""
    if names is None:
        names = [*DEFAULT_CANDIDATES, *MULTICLASS_CANDIDATES, *(n for group in ARRAY_CANDIDATES.values() for n in group)]
    declared: dict[str, ArraySpec] = {}
    for name in names:
        method = methods.get(name) if isinstance(name, str) and name != "auto" else None
        specs = getattr(method, kind, None)
        for array, spec in (specs.items() if isinstance(specs, dict) else ()):  # a property (selective's): none here
            declared.setdefault(array, replace(spec, required=False))
    return declared


class _CandidatesArrays:
    """``auto``'s declared arrays: on the class, the default candidates' (each optional), so
    code that reads a method's arrays from its class sees them; on an instance, its own."""

    def __init__(self, kind: str):
        self.kind = kind

    def __get__(self, instance: Any, owner: type) -> dict[str, ArraySpec]:
        if instance is None:
            return declared_arrays(owner.methods, None, self.kind)
        return getattr(instance, f"_{self.kind}")()


def _class_arrays(method: type[Calibrator]) -> dict[str, ArraySpec]:
    """A method's class-level predict arrays (a property, as selective's, gives none here)."""
    declared = method.predict_arrays
    return declared if isinstance(declared, dict) else {}


class AutoCalibrator(Calibrator):
    """Automatic choice: the candidate method with the lowest cross-validated log-loss, refitted.

    Every candidate is fitted on ``n_splits`` - 1 folds and scored on the fold it did not see;
    the one with the lowest mean out-of-fold log-loss is refitted on the whole holdout and
    answers ``predict``. Extra arrays (``features``) go to the candidates that declare them.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    candidates : list of str or None, default=None
        Method names to choose among; None is every method for the kind of scores given
        (binary: platt, temperature, beta, isotonic, histogram, venn_abers, scaling_binning,
        and multicalibration when ``features`` are given; multiclass: temperature, vector,
        matrix, dirichlet, ovr_platt, ovr_isotonic, top_label_histogram). A candidate that
        cannot fit the holdout is skipped, with the reason.
    n_splits : int, default=5
        Folds of the cross-validation, 2 to 20.
    seed : int, default=0
        Seeds the (stratified) fold assignment.

    Attributes
    ----------
    chosen_ : str
        The method chosen.
    cv_log_loss_ : dict
        Each scored candidate's mean out-of-fold log-loss.
    skipped_ : dict
        The candidates that could not fit, each with the reason.
    calibrator_ : Calibrator
        The chosen method, fitted on the whole holdout.

    References
    ----------
    The choice is K-fold cross-validation (M. Stone, "Cross-validatory choice and assessment
    of statistical predictions", JRSS B, 1974) of the candidates, each with its own paper.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.auto import AutoCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = AutoCalibrator(candidates=["platt", "beta", "isotonic"]).fit(scores, labels)
    >>> {name: round(loss, 4) for name, loss in calibrator.cv_log_loss_.items()}
    {'platt': 0.4095, 'beta': 0.4064, 'isotonic': 0.4396}
    >>> calibrator.chosen_, calibrator.predict([0.2, 0.5, 0.8]).round(3)
    ('beta', array([0.018, 0.236, 0.691]))
    """

    method = "auto"
    tasks = ("binary", "multiclass")
    # Every candidate is cross-validated on every fold.
    max_samples = 1_000_000
    fitted_attributes = ("chosen_", "cv_log_loss_", "skipped_", "calibrator_")
    #: Every method by name, set by the registry (which imports this module, not the reverse).
    methods: ClassVar[Mapping[str, type[Calibrator]]] = {}

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

    def _candidate_names(self, multiclass: bool, given: frozenset[str] = frozenset()) -> list[str]:
        if self.candidates is not None:
            return list(dict.fromkeys(self.candidates))
        task = "multiclass" if multiclass else "binary"
        extra = [name for name in ARRAY_CANDIDATES[task] if given & set(self.methods[name].fit_arrays)]
        return list(MULTICLASS_CANDIDATES if multiclass else DEFAULT_CANDIDATES) + extra

    def _declared(self, kind: str) -> dict[str, ArraySpec]:
        """Every array the candidates' fit (or predict) declares, optional (the first declaration of a name)."""
        names = self.candidates if isinstance(self.candidates, list) else None
        return declared_arrays(self.methods, names, kind)

    def _fit_arrays(self) -> dict[str, ArraySpec]:
        """The candidates' arrays, each optional."""
        return self._declared("fit_arrays")

    def _predict_arrays(self) -> dict[str, ArraySpec]:
        """Unfitted: every candidate's, optional. Fitted: the arrays it was fitted with, optional,
        whichever method was chosen (a client need not know the choice), and the chosen
        method's own as that method declares them (it gets those; the others are dropped).
        """
        declared = {**self._declared("fit_arrays"), **self._declared("predict_arrays")}
        chosen = getattr(self, "calibrator_", None)
        if chosen is None:
            return declared
        return {**{name: declared[name] for name in getattr(self, "arrays_", ()) if name in declared}, **chosen.predict_arrays}

    fit_arrays = _CandidatesArrays("fit_arrays")  # type: ignore[assignment]
    predict_arrays = _CandidatesArrays("predict_arrays")  # type: ignore[assignment]

    def _check_params(self) -> None:
        if self.candidates is not None:
            if not isinstance(self.candidates, list) or not self.candidates:
                raise CalibrationInputError("options.candidates", "must be a non-empty list of method names")
            methods = self.methods
            for i, name in enumerate(self.candidates):
                takes_scores_alone = name in methods and not any(s.required for s in methods[name].fit_arrays.values())
                if name not in methods or name == "auto" or not takes_scores_alone:
                    known = ", ".join(dict.fromkeys(DEFAULT_CANDIDATES + MULTICLASS_CANDIDATES + ARRAY_CANDIDATES["binary"]))
                    raise CalibrationInputError("options.candidates", f"unknown candidate {name!r} (known: {known})", (i,))
            # One array name, one meaning: a request cannot send both selective's and multicalibration's features.
            seen: dict[str, tuple[str, ArraySpec]] = {}
            for i, name in enumerate(self.candidates):
                for array, spec in {**methods[name].fit_arrays, **_class_arrays(methods[name])}.items():
                    first = seen.setdefault(array, (name, spec))
                    if replace(first[1], required=False, description="") != replace(spec, required=False, description=""):
                        raise CalibrationInputError(
                            "options.candidates", f"{first[0]} and {name} take different arrays named {array!r}; list one of them", (i,)
                        )
        if not isinstance(self.n_splits, int) or isinstance(self.n_splits, bool) or not 2 <= self.n_splits <= 20:
            raise CalibrationInputError("options.n_splits", "must be an integer from 2 to 20")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise CalibrationInputError("options.seed", "must be an integer")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, **arrays: Any) -> None:
        multiclass = scores.ndim == 2
        task = "multiclass" if multiclass else "binary"
        names = self._candidate_names(multiclass, frozenset(arrays))
        self.arrays_ = sorted(arrays)
        folds = stratified_folds(labels, self.n_splits, self.seed)
        self.skipped_ = {}
        self.same_model_as_ = {}
        first_of: dict[tuple, str] = {}
        runnable: list[tuple[str, Calibrator]] = []
        for name in names:
            candidate = self.methods[name](input=self.input)
            if self.input not in candidate.inputs or task not in candidate.tasks:
                self.skipped_[name] = f"takes no {task} {self.input} scores"
                continue
            key = model_key(candidate)
            if key in first_of:
                self.same_model_as_[name] = first_of[key]
                continue
            if key is not None:
                first_of[key] = name
            runnable.append((name, candidate))
        results = cross_validate(runnable, scores, labels, weights, folds, available_threads(), arrays)
        scored: dict[str, float] = {}
        for name, _ in runnable:
            result = results[name]
            if isinstance(result, CalibrationInputError):
                self.skipped_[name] = result.detail
            else:
                scored[name] = log_loss(result[0], labels, weights)
        for name, twin in self.same_model_as_.items():
            if twin in scored:
                scored[name] = scored[twin]
            else:
                self.skipped_[name] = self.skipped_[twin]
        # In the listed order, so that a twin's equal score never displaces the first listed.
        self.cv_log_loss_ = {name: scored[name] for name in names if name in scored}
        if not self.cv_log_loss_:
            raise CalibrationInputError("options.candidates", f"no candidate can fit these scores: {self.skipped_}")
        self.chosen_ = min(self.cv_log_loss_, key=self.cv_log_loss_.get)
        predictions, details = results[self.same_model_as_.get(self.chosen_, self.chosen_)]
        self.out_of_fold_ = OutOfFold(folds, predictions, details)
        self.calibrator_ = self.methods[self.chosen_](input=self.input)
        self.calibrator_._fit(scores, labels, weights, **arrays_for(self.calibrator_, arrays))
        self.calibrator_.n_classes_ = n_classes_of(scores, self.calibrator_.tasks)

    def prepare(self) -> None:
        self.calibrator_.prepare()

    def _chosen_arrays(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in arrays.items() if name in self.calibrator_.predict_arrays}

    def _predict(self, scores: np.ndarray, **arrays: Any) -> np.ndarray:
        return self.calibrator_._predict(scores, **self._chosen_arrays(arrays))

    def _predict_details(self, scores: np.ndarray, **arrays: Any):
        return self.calibrator_._predict_details(scores, **self._chosen_arrays(arrays))

    def fit_info(self) -> dict:
        return {
            "chosen": self.chosen_,
            "reason": f"lowest {self.n_splits}-fold cross-validated log-loss",
            "cv_log_loss": self.cv_log_loss_,
            "skipped": self.skipped_,
            "same_model_as": getattr(self, "same_model_as_", {}),
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
            "same_model_as_": getattr(self, "same_model_as_", {}),
            "arrays_": getattr(self, "arrays_", []),
            "calibrator_": self.calibrator_.to_dict(),
        }
        return {"method": self.method, "params": self.get_params(), "n_classes": getattr(self, "n_classes_", 2), "state": state}

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> AutoCalibrator:
        calibrator = cls(**params)
        calibrator.chosen_ = state["chosen_"]
        calibrator.cv_log_loss_ = dict(state["cv_log_loss_"])
        calibrator.skipped_ = dict(state.get("skipped_", {}))
        calibrator.same_model_as_ = dict(state.get("same_model_as_", {}))
        calibrator.arrays_ = [name for name in state.get("arrays_", []) if isinstance(name, str)]
        inner = state["calibrator_"]
        if inner["method"] not in cls.methods:
            known = ", ".join(sorted(cls.methods))
            raise CalibrationInputError("method", f"unknown method {inner['method']!r} (known: {known})")
        calibrator.calibrator_ = cls.methods[inner["method"]].from_dict(inner)
        calibrator.n_classes_ = 2
        return calibrator
