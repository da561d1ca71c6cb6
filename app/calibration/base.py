"""The calibrator contract shared by every method.

A calibrator is a scikit-learn style estimator: constructor arguments are its
options (``get_params``), attributes ending in ``_`` are learned by ``fit``.
It serialises to plain JSON types with ``to_dict`` and back with
``from_dict``; nothing is ever pickled.

Inputs are validated at the boundary (:mod:`calibd.calibration.validation`, built on
:mod:`calibd.inputs`), and scores converted to the scale a method works on
(:mod:`calibd.calibration.scales`).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator  # clone(), Pipeline and estimator tags work on every calibrator
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils import ClassifierTags, Tags

from ..inputs import CalibrationInputError, as_float_array, check_sample_weight, first_index
from ._fastpath import quick_scores
from .scales import INPUT_KINDS
from . import sklearn_checks
from .validation import (
    ArraySpec,
    check_arrays,
    check_holdout,
    check_scores,
    column_names,
    encode_labels,
    labels_from_y,
    n_classes_of,
    numbers_from_objects,
)

# Temporary: modules being rewritten elsewhere still import these from here
# (calibration/multicalibration.py: sigmoid, to_logit; monitoring/drift.py: EPS, as_float_array;
# monitoring/segments.py, api/feedback/router.py: CalibrationInputError, as_float_array, check_scores,
# encode_labels). Point them at calibd.inputs, .scales and .validation, then delete this line.
from .scales import EPS, sigmoid, to_logit  # noqa: E402,F401


class NotFittedError(SklearnNotFittedError):
    """``predict`` was called before ``fit`` (scikit-learn's ``NotFittedError``, as its
    ``check_is_fitted`` and estimator checks expect)."""


class Calibrator(BaseEstimator):
    """Base class of every calibration method.

    Subclasses set ``method`` (the registry name), override ``_fit`` and
    ``_predict``, list their learned attributes in ``fitted_attributes``, and
    may override ``_check_params`` to validate their options.
    """

    method: ClassVar[str]
    #: The input kinds this method accepts.
    inputs: ClassVar[tuple[str, ...]] = INPUT_KINDS
    #: "binary": scores (n,) and 0/1 labels; "multiclass": rows of K scores and
    #: labels 0..K-1; "multivariate": rows of M scores and 0/1 labels.
    tasks: ClassVar[tuple[str, ...]] = ("binary",)
    #: The smallest holdout this method will fit.
    min_samples: ClassVar[int] = 10
    #: The largest holdout this method will fit (a service may set a lower limit).
    max_samples: ClassVar[int] = 10_000_000
    #: Learned attributes, saved by ``to_dict``.
    fitted_attributes: ClassVar[tuple[str, ...]] = ()
    #: True when the output is a non-decreasing function of the score.
    monotone: ClassVar[bool] = True
    #: Extra arrays taken by fit (from the holdout) and by predict (beside the scores).
    fit_arrays: ClassVar[dict[str, ArraySpec]] = {}
    predict_arrays: ClassVar[dict[str, ArraySpec]] = {}
    #: Documented option names that are not constructor arguments (``lambda`` is a
    #: Python keyword), mapped to the argument they set.
    option_aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, input: str = "probability"):
        self.input = input

    # -- scikit-learn estimator conventions ---------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return [name for name in signature.parameters if name != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> Calibrator:
        params = {self.option_aliases.get(name, name): value for name, value in params.items()}
        valid = set(self._get_param_names())
        for name, value in params.items():
            if name not in valid:
                raise CalibrationInputError(f"options.{name}", f"unknown option for {self.method}")
            setattr(self, name, value)
        return self

    @classmethod
    def from_options(cls, input: str, options: dict[str, Any] | None = None) -> Calibrator:
        """Build from a service request's ``input`` and ``options``, rejecting unknown names.

        An alias in ``option_aliases`` sets its constructor argument.
        """
        options = dict(options or {})
        known = [*cls.option_aliases, *(name for name in cls._get_param_names() if name != "input")]
        for name in options:
            if name not in known:
                accepted = ", ".join(known) or "none"
                raise CalibrationInputError(
                    f"options.{name}", f"unknown option for {cls.method} (accepted: {accepted})"
                )
        for alias, target in cls.option_aliases.items():
            if alias in options:
                if target in options:
                    raise CalibrationInputError(f"options.{alias}", f"give {alias} or its alias {target}, not both")
                options[target] = options.pop(alias)
        calibrator = cls(input=input, **options)
        calibrator._validate_params()
        return calibrator

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    # -- validation ---------------------------------------------------------
    def _validate_params(self) -> None:
        if self.input not in self.inputs:
            raise CalibrationInputError(
                "input", f"{self.method} accepts input {' or '.join(map(repr, self.inputs))}"
            )
        self._check_params()

    def _check_params(self) -> None:
        """Raise CalibrationInputError for invalid options (field ``options.<name>``)."""

    def __sklearn_is_fitted__(self) -> bool:
        return all(hasattr(self, a) for a in self.fitted_attributes)

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet; call fit first")

    # -- the contract -------------------------------------------------------
    def fit(self, X: Any, y: Any, sample_weight: Any = None, **arrays: Any) -> Calibrator:
        """Fit on a labelled holdout: ``X`` the scores, ``y`` the labels.

        ``X``: 1-D scores or one column (n, 1) for binary methods, rows (n, K) for
        multiclass and multivariate ones. ``y``: 0/1 for binary scores (or any two
        values, the larger one the positive class, as scikit-learn orders ``classes_``),
        0..K-1 (or K class names) for rows of K. Extra arrays (``features``, ...) by name.
        """
        return self._fit_holdout(X, y, sample_weight, arrays)

    def _fit_holdout(self, X: Any, y: Any, sample_weight: Any, arrays: dict[str, Any]) -> Calibrator:
        if y is None:
            raise CalibrationInputError("labels", f"{type(self).__name__} requires y to be passed, but the target y is None")
        scores = self._scores_from_X(X, reset=True)
        self._validate_params()
        labels, classes = labels_from_y(y, n_classes_of(scores, self.tasks))
        scores, labels, weights, names = self.check_holdout_arrays(scores, labels, sample_weight)
        self._fit(scores, labels, weights, **check_arrays(arrays, self.fit_arrays, scores.shape[0]))
        self.n_classes_ = n_classes_of(scores, self.tasks)
        if names is not None:
            classes = np.asarray(names)
        self.classes_ = classes if classes is not None else np.arange(self.n_classes_)
        return self

    def _scores_from_X(self, X: Any, reset: bool) -> np.ndarray:
        """scikit-learn's ``X`` as the scores this calibrator takes (``fit``, ``predict``).

        A column (n, 1) is taken as flat binary scores. ``fit`` records ``n_features_in_``
        (1 for flat scores) and a DataFrame's ``feature_names_in_``; ``predict`` checks
        them. Messages follow scikit-learn's conventions; the service's own entry points
        (``check_holdout_arrays``, ``predict_details``) keep theirs.
        """
        name = type(self).__name__
        if sparse.issparse(X):
            raise CalibrationInputError("scores", "sparse input is not supported; pass a dense array (X.toarray())")
        columns = column_names(X)
        source = X  # as_float_array reads a list's booleans, refused as the service refuses them
        try:
            array = np.asarray(X)
        except ValueError:
            pass  # ragged rows: as_float_array says so
        else:
            if array.dtype.kind == "O":
                array = source = numbers_from_objects(array, "scores")
            if array.dtype.kind == "c":
                raise CalibrationInputError("scores", "Complex data not supported: scores must be real numbers")
            if array.ndim == 0:
                raise CalibrationInputError(
                    "scores", "got a single number, not an array: Reshape your data, e.g. np.atleast_1d(score)"
                )
        # Numbers and finiteness first, so NaN is named even in an array of the wrong shape.
        scores = as_float_array(source if isinstance(source, list) else array, "scores", ndim=(1, 2))
        n_features = 1 if scores.ndim == 1 else scores.shape[1]
        binary = "binary" in self.tasks
        if reset:
            rows_only = self.tasks == ("multiclass",)  # rows of K >= 2 class scores
            minimum = 2 if rows_only else 1
            if scores.ndim == 1 and rows_only:
                raise CalibrationInputError(
                    "scores", f"{name} takes rows of scores, got a 1-D array: Reshape your data with X.reshape(1, -1) for one row"
                )
            if n_features < minimum:
                raise CalibrationInputError(
                    "scores", f"found {n_features} feature(s) (shape={scores.shape}) while a minimum of {minimum} is required."
                )
            if self.tasks == ("binary",) and n_features > 1:
                raise CalibrationInputError(
                    "scores", f"{name} takes one score per row (1-D, or one column) but X has {n_features} feature(s) (shape={scores.shape})"
                )
            self.n_features_in_ = n_features
            if columns is not None:
                self.feature_names_in_ = columns
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        else:
            self._check_fitted()
            expected = getattr(self, "n_features_in_", None)
            # A binary fit of a method that also takes rows answers the two-column form [z0, z1] as well.
            two_class_rows = expected == 1 and n_features == 2 and set(self.tasks) == {"binary", "multiclass"}
            if expected is not None and n_features != expected and not two_class_rows:
                if scores.ndim == 1:
                    raise CalibrationInputError(
                        "scores", f"{name} expects rows of {expected} scores, got a 1-D array: Reshape your data with X.reshape(1, -1) for one row"
                    )
                raise CalibrationInputError("scores", f"X has {n_features} features, but {name} is expecting {expected} features as input")
            fitted_names = getattr(self, "feature_names_in_", None)
            if fitted_names is not None and columns is not None and not np.array_equal(fitted_names, columns):
                raise CalibrationInputError(
                    "scores", f"The feature names should match those that were passed during fit: {list(fitted_names)}, got {list(columns)}"
                )
        if scores.ndim == 2 and n_features == 1 and binary:
            scores = scores[:, 0]
        return scores

    def check_holdout_arrays(
        self,
        scores: Any,
        labels: Any,
        sample_weight: Any = None,
        classes: list[Any] | None = None,
        max_samples: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any] | None]:
        """Validated (scores, integer labels, weights, class names) for a fit."""
        limit = min(self.max_samples, max_samples or self.max_samples)
        if hasattr(scores, "__len__") and len(scores) > limit:
            raise CalibrationInputError(
                "scores", f"{len(scores)} rows is more than {self.method} fits here (at most {limit})"
            )
        scores = check_scores(scores, self.input, self.tasks)
        n_classes = n_classes_of(scores, self.tasks)
        labels, names = encode_labels(labels, scores.shape[0], n_classes, classes)
        weights = check_sample_weight(sample_weight, scores.shape[0])
        check_holdout(labels, weights, self.min_samples, n_classes)
        return scores, labels, weights, names

    def check_predict_scores(self, scores: Any) -> np.ndarray:
        """Validated scores of the shape this calibrator was fitted on."""
        self._check_fitted()
        # Components fitted through ``_fit`` by another calibrator carry no n_classes_.
        binary = getattr(self, "n_classes_", 2) == 2 and "binary" in self.tasks
        if binary:  # the hot path: a valid float64 array is returned as it is, as check_scores would
            quick = quick_scores(scores, self.input)
            if quick is not None:
                return quick
        columns = None if binary else self.n_columns_
        return check_scores(scores, self.input, self.tasks, n_columns=columns)

    @property
    def n_columns_(self) -> int:
        return self.n_classes_

    def prepare(self) -> None:
        """Build whatever speeds up predict (the calibrator cache calls this once, before sizing
        an entry, so that requests never do); most methods have nothing to build."""

    def predict(self, X: Any, **arrays: Any) -> np.ndarray:
        """Calibrated probabilities: of class 1, shape (n,), for binary scores; rows (n, K) otherwise.

        ``X`` as at ``fit``: 1-D scores or one column for a binary calibrator, rows otherwise.
        """
        return self.predict_details(self._scores_from_X(X, reset=False), **arrays)[0]

    def predict_proba(self, X: Any, **arrays: Any) -> np.ndarray:
        """Calibrated probabilities of every class, shape ``(n, K)`` (binary: ``(n, 2)``)."""
        p = self.predict(X, **arrays)
        return p if p.ndim == 2 else np.column_stack([1.0 - p, p])

    # -- scikit-learn's estimator tags and checks -----------------------------
    def __sklearn_tags__(self) -> Tags:
        """Binary-only methods take 1-D scores (as ``IsotonicRegression``) and one column;
        methods that take rows declare rows (their flat binary face is tested apart, as
        ``IsotonicRegression`` declares 1-D though it takes a column too). ``y`` is required."""
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.input_tags.one_d_array = self.tasks == ("binary",)
        tags.input_tags.two_d_array = True
        tags.classifier_tags = ClassifierTags(multi_class="multiclass" in self.tasks)
        return tags

    def expected_failed_checks(self) -> dict[str, str]:
        """scikit-learn estimator checks that do not apply to this method, each with its reason.

        ``check_estimator(calibrator, expected_failed_checks=calibrator.expected_failed_checks())``
        runs every other check (tests/test_sklearn_checks.py, which also shows that each of
        these does fail, and checks the same properties on 1-D scores where they apply).
        """
        return sklearn_checks.expected_failed_checks(self.method, self.tasks, self.min_samples)

    def predict_details(self, scores: Any, **arrays: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``predict`` plus any per-row extras the method reports (``intervals``, ``accepted``)."""
        scores = self.check_predict_scores(scores)
        return self._predict_details(scores, **check_arrays(arrays, self.predict_arrays, scores.shape[0]))

    def predict_compiled(self, scores: Any) -> np.ndarray | None:
        """``predict`` of plain valid scores by a compiled kernel (``kernels.py``): a JSON list of
        floats or rows of floats, or a C-contiguous float64 array; None when the method has no
        kernel, the kernels are off, or the scores need ``predict``'s checks (which name the bad
        element). No extra arrays: methods that take them have no kernel."""
        return None

    def _predict_details(self, scores: np.ndarray, **arrays: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Validated inputs in, (probabilities, extras) out; methods with extras override this."""
        return self._predict(scores, **arrays), {}

    def cross_fit_summary(
        self,
        out_of_fold: np.ndarray,
        extras: dict[str, np.ndarray],
        scores: np.ndarray,
        labels: np.ndarray,
        weights: np.ndarray,
        arrays: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """Method-specific summary items from the out-of-fold predictions and extras (default none).

        Gets the validated holdout too, so a method can cross-fit baselines on the same rows.
        """
        return {}

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, **arrays: np.ndarray) -> None:
        raise NotImplementedError

    def _predict(self, scores: np.ndarray, **arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fit_info(self) -> dict[str, Any]:
        """What the fit learned that a person would want to read (JSON types)."""
        return {}

    # -- learned state ---------------------------------------------------------
    def check_state(self) -> Calibrator:
        """Check the learned state; returns ``self``.

        Every fit's output passes these checks, and an imported calibrator must pass
        them before it is served: every learned attribute present, every number finite,
        ``n_classes`` an integer >= 2 (2 for binary-only methods), and the method's own
        checks (``_check_state``: shapes that agree, probabilities within [0, 1],
        thresholds in order). Raises CalibrationInputError whose field names the
        attribute (``state.y_thresholds_``, or ``n_classes``) and the first bad element.
        """
        missing = [a for a in self.fitted_attributes if not hasattr(self, a)]
        if missing:
            raise CalibrationInputError(f"state.{missing[0]}", "missing")
        n_classes = getattr(self, "n_classes_", 2)
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise CalibrationInputError("n_classes", "must be an integer >= 2")
        if n_classes > 2 and self.tasks == ("binary",):
            raise CalibrationInputError("n_classes", f"{self.method} calibrates binary scores: n_classes must be 2")
        for name in self.fitted_attributes:
            value = getattr(self, name)
            if isinstance(value, Calibrator):
                try:
                    value.check_state()
                except CalibrationInputError as error:
                    raise CalibrationInputError(f"state.{name}.{error.field}", error.detail, error.index) from None
            elif isinstance(value, np.ndarray):
                if value.dtype.kind not in "fiu":
                    raise CalibrationInputError(f"state.{name}", "must be an array of numbers")
                bad = ~np.isfinite(value)
                if bad.any():
                    raise CalibrationInputError(f"state.{name}", "must be finite", first_index(bad))
            elif isinstance(value, float) and not math.isfinite(value):
                raise CalibrationInputError(f"state.{name}", "must be finite")
        self._check_state()
        return self

    def _check_state(self) -> None:
        """The method's own checks of its learned state (see ``check_state``); helpers:
        ``state_array`` and ``state_number``."""

    # -- serialisation --------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: method name, options and learned state."""
        self._check_fitted()
        state = {name: _to_json(getattr(self, name)) for name in self.fitted_attributes}
        return {"method": self.method, "params": self.get_params(), "n_classes": getattr(self, "n_classes_", 2), "state": state}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibrator:
        """Rebuild from ``to_dict`` output of this class."""
        calibrator = cls._from_state(data["params"], data["state"])
        calibrator.n_classes_ = int(data.get("n_classes", 2))
        return calibrator

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> Calibrator:
        calibrator = cls(**params)
        for name in cls.fitted_attributes:
            setattr(calibrator, name, _from_json(state[name]))
        calibrator.n_classes_ = 2
        return calibrator


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return np.asarray(value, dtype=np.float64)
    return value
