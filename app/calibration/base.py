"""The calibrator contract shared by every method, and input validation.

A calibrator is a scikit-learn style estimator: constructor arguments are its
options (``get_params``), attributes ending in ``_`` are learned by ``fit``.
It serialises to plain JSON types with ``to_dict`` and back with
``from_dict``; nothing is ever pickled.

Scores are validated here, at the boundary, in O(n) numpy: every method
accepts ``input="probability"`` (values in [0, 1]) or ``input="logit"`` (any
finite real), and converts to the scale it works on with ``to_logit`` or
``to_probability``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from itertools import chain
from numbers import Real
from typing import Any, ClassVar

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator  # clone(), Pipeline and estimator tags work on every calibrator
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils import ClassifierTags, Tags

from ._fastpath import quick_scores

INPUT_KINDS = ("probability", "logit")

# Probabilities are clipped to [EPS, 1 - EPS] before taking logits, so that a
# score of exactly 0 or 1 maps to a large but finite logit.
EPS = 1e-12


class CalibrationInputError(ValueError):
    """Invalid input to a calibrator.

    ``field`` names the offending argument (``"scores"``, ``"labels"``,
    ``"sample_weight"``, ``"options.n_bins"``, or an extra array's name) and
    ``index`` the first offending element (a tuple for 2-D arrays), so that a
    service can point at it.
    """

    def __init__(self, field: str, detail: str, index: tuple[int, ...] | None = None):
        self.field = field
        self.detail = detail
        self.index = index
        where = field + "".join(f"[{i}]" for i in index or ())
        super().__init__(f"{where}: {detail}")


class NotFittedError(SklearnNotFittedError):
    """``predict`` was called before ``fit`` (scikit-learn's ``NotFittedError``, as its
    ``check_is_fitted`` and estimator checks expect)."""


class CalibrationInputTypeError(CalibrationInputError, TypeError):
    """An element that is not a number where numbers are expected (a TypeError too, as
    numpy's conversion raises)."""


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask.ravel())[0]), mask.shape))


NOT_A_BOOLEAN = "must be a number, not true or false"


def may_hold_booleans(array: np.ndarray) -> bool:
    """False when no element is 0 or 1, the values numpy and ``struct`` make of JSON's
    false and true in a list of numbers: then the list needs no closer look."""
    return bool(np.logical_or(array == 0.0, array == 1.0).any())


def boolean_index(values: list, ndim: int) -> tuple[int, ...] | None:
    """The index of the first ``True`` or ``False`` in a list (``ndim=1``) or a list of rows
    (``ndim=2``), or None. Booleans are not numbers: ``[0.1, true]`` is not a score array.
    The elements' types are gathered in C; only a list that holds a boolean is walked."""
    flat = values if ndim == 1 else chain.from_iterable(values)
    if bool not in set(map(type, flat)):
        return None
    if ndim == 1:
        return (next(i for i, value in enumerate(values) if type(value) is bool),)
    return next((i, j) for i, row in enumerate(values) for j, value in enumerate(row) if type(value) is bool)


def refuse_booleans(values: Any, array: np.ndarray, field: str) -> None:
    """Raise if the list ``values``, made the float ``array``, held a boolean."""
    if isinstance(values, list) and array.size and may_hold_booleans(array):
        where = boolean_index(values, array.ndim)
        if where is not None:
            raise CalibrationInputError(field, NOT_A_BOOLEAN, where)


def as_float_array(values: Any, field: str, ndim: int | tuple[int, ...] = 1) -> np.ndarray:
    """Convert to a finite float64 array of the given number of dimensions.

    ``true`` and ``false`` are refused wherever they are (numpy would read them as 1 and 0).
    """
    try:
        array = np.asarray(values)
    except ValueError:
        raise CalibrationInputError(field, "rows must all have the same length") from None
    if array.dtype.kind == "b" and array.size:
        raise CalibrationInputError(field, NOT_A_BOOLEAN, (0,) * array.ndim)
    if array.dtype.kind not in "fiu":
        raise CalibrationInputError(field, "must contain only numbers")
    array = np.ascontiguousarray(array, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if array.ndim not in allowed:
        shapes = " or ".join({1: "a flat list", 2: "a list of rows"}[d] for d in allowed)
        raise CalibrationInputError(field, f"must be {shapes}")
    refuse_booleans(values, array, field)
    if array.shape[0] == 0:
        raise CalibrationInputError(field, "must not be empty")
    finite = np.isfinite(array)
    if not finite.all():
        raise CalibrationInputError(field, "must be finite (no NaN or infinity)", _first_index(~finite))
    return array


#: Probability rows may be off by this much from summing to 1 (rounded inputs are common).
ROW_SUM_TOLERANCE = 1e-3


def check_scores(
    scores: Any, input: str, tasks: tuple[str, ...] = ("binary",), n_columns: int | None = None, field: str = "scores"
) -> np.ndarray:
    """Validate scores: a flat array (binary) or rows of K columns (multiclass, multivariate).

    Probability rows of a multiclass calibrator must sum to 1 within
    ROW_SUM_TOLERANCE and come back renormalised.
    """
    dims = tuple(sorted({1 if task == "binary" else 2 for task in tasks}))
    scores = as_float_array(scores, field, ndim=dims)
    if scores.ndim == 2:
        if scores.shape[1] < 2:
            raise CalibrationInputError(field, "rows need at least 2 columns")
        if n_columns is not None and scores.shape[1] != n_columns:
            raise CalibrationInputError(
                field, f"rows have {scores.shape[1]} columns but this calibrator was fitted on {n_columns}", (0,)
            )
    if input == "probability":
        outside = (scores < 0.0) | (scores > 1.0)
        if outside.any():
            raise CalibrationInputError(
                field, "probabilities must lie in [0, 1]; send input='logit' for raw scores", _first_index(outside)
            )
        if scores.ndim == 2 and "multiclass" in tasks:
            sums = scores.sum(axis=1)
            off = np.abs(sums - 1.0) > ROW_SUM_TOLERANCE
            if off.any():
                row = int(np.flatnonzero(off)[0])
                raise CalibrationInputError(
                    field, f"probability rows must sum to 1 (within {ROW_SUM_TOLERANCE}); this one sums to {sums[row]:.6g}", (row,)
                )
            scores = scores / sums[:, None]
    return scores


def encode_labels(
    labels: Any, n_samples: int, n_classes: int, classes: list[Any] | None = None, field: str = "labels"
) -> tuple[np.ndarray, list[Any] | None]:
    """Labels as ints 0..n_classes-1, and the class names when labels are strings.

    Integer labels are used as they are. String labels are mapped through
    ``classes`` (default: the sorted distinct labels, as scikit-learn's
    ``LabelEncoder`` orders them), whose order is the order of the score columns.
    """
    try:
        array = np.asarray(labels) if not isinstance(labels, np.ndarray) else labels
    except ValueError:  # ragged nesting
        raise CalibrationInputError(field, "must be a flat list of labels") from None
    if array.dtype.kind not in "US":
        codes = as_float_array(array, field, ndim=1)
        refuse_booleans(labels, codes, field)
        if codes.shape[0] != n_samples:
            raise CalibrationInputError(field, f"has {codes.shape[0]} entries but scores has {n_samples}")
        bad = (codes != np.floor(codes)) | (codes < 0) | (codes >= n_classes)
        if bad.any():
            allowed = "0 or 1" if n_classes == 2 else f"integers from 0 to {n_classes - 1}"
            raise CalibrationInputError(field, f"labels must be {allowed}", _first_index(bad))
        return codes.astype(np.int8 if n_classes <= 127 else np.int32), None
    if array.ndim != 1:
        raise CalibrationInputError(field, "must be a flat list")
    if array.shape[0] != n_samples:
        raise CalibrationInputError(field, f"has {array.shape[0]} entries but scores has {n_samples}")
    names = np.unique(array) if classes is None else np.asarray(classes, dtype=str)
    if classes is not None and np.unique(names).shape[0] != names.shape[0]:
        raise CalibrationInputError("classes", "class names must be distinct")
    if names.shape[0] != n_classes:
        raise CalibrationInputError(
            "classes" if classes is not None else field,
            f"{names.shape[0]} distinct classes but the scores have {n_classes} columns",
        )
    order = np.argsort(names)
    position = np.clip(np.searchsorted(names[order], array), 0, n_classes - 1)
    unknown = names[order][position] != array
    if unknown.any():
        raise CalibrationInputError(field, "not one of the classes", _first_index(unknown))
    return order[position].astype(np.int32), names.tolist()


def check_sample_weight(sample_weight: Any, n_samples: int, field: str = "sample_weight") -> np.ndarray:
    """Validate non-negative weights with a positive sum; None means all ones."""
    if sample_weight is None:
        return np.ones(n_samples)
    weights = as_float_array(sample_weight, field, ndim=1)
    if weights.shape[0] != n_samples:
        raise CalibrationInputError(field, f"has {weights.shape[0]} entries but scores has {n_samples}")
    negative = weights < 0
    if negative.any():
        raise CalibrationInputError(field, "weights must be non-negative", _first_index(negative))
    if not weights.sum() > 0:
        raise CalibrationInputError(field, "weights must not all be zero")
    return weights


def to_logit(scores: np.ndarray, input: str) -> np.ndarray:
    """Scores on the logit scale: log(p / (1 - p)) for probabilities."""
    if input == "logit":
        return scores
    p = np.clip(scores, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def to_probability(scores: np.ndarray, input: str) -> np.ndarray:
    """Scores on the probability scale: the logistic sigmoid of logits."""
    if input == "probability":
        return scores
    return sigmoid(scores)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function, without overflow warnings for large |z|."""
    return np.exp(-np.logaddexp(0.0, -z))


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
        labels, classes = _labels_from_y(y, n_classes_of(scores, self.tasks))
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
        columns = _column_names(X)
        source = X  # as_float_array reads a list's booleans, refused as the service refuses them
        try:
            array = np.asarray(X)
        except ValueError:
            pass  # ragged rows: as_float_array says so
        else:
            if array.dtype.kind == "O":
                array = source = _numbers_from_objects(array, "scores")
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
        expected: dict[str, str] = {}
        if self.tasks == ("binary",):
            expected |= dict.fromkeys(ONE_D_INDEXING_CHECKS, ONE_D_INDEXING)
            expected["check_fit1d"] = "1-D scores are a binary calibrator's own input; the check expects them refused"
            expected |= dict.fromkeys(SEVERAL_COLUMN_CHECKS, SEVERAL_COLUMNS)
        if "multiclass" in self.tasks:
            expected |= dict.fromkeys(BLOBS_CHECKS, BLOBS)
            expected["check_sample_weight_equivalence_on_dense_data"] = ONE_ROW_CLASS
        if self.min_samples > 16:
            few = f"{self.method} needs at least {self.min_samples} rows; the check fits 10 to 16"
            for check in FEW_ROWS_CHECKS:
                expected.setdefault(check, few)
        return expected

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
                    raise CalibrationInputError(f"state.{name}", "must be finite", _first_index(bad))
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


def state_array(
    value: Any,
    name: str,
    ndim: int = 1,
    shape: tuple[int | None, ...] | None = None,
    within: tuple[float, float] | None = None,
    non_decreasing: bool = False,
) -> np.ndarray:
    """A learned array checked: its dimensions and ``shape`` (None: any length), values
    ``within`` [low, high], and for ``non_decreasing`` each element >= the one before it
    (along the first axis). Raises CalibrationInputError at ``state.<name>``."""
    field = f"state.{name}"
    if not isinstance(value, np.ndarray) or value.ndim != ndim or value.dtype.kind not in "fiu":
        raise CalibrationInputError(field, "must be a list of numbers" if ndim == 1 else f"must be a {ndim}-dimensional array of numbers")
    if shape is not None and any(want is not None and have != want for have, want in zip(value.shape, shape)):
        expected = " x ".join("n" if want is None else str(want) for want in shape)
        raise CalibrationInputError(field, f"has shape {' x '.join(map(str, value.shape))}, expected {expected}")
    if within is not None:
        outside = (value < within[0]) | (value > within[1])
        if outside.any():
            raise CalibrationInputError(field, f"must lie within [{within[0]:g}, {within[1]:g}]", _first_index(outside))
    if non_decreasing and value.shape[0] > 1:
        falling = np.diff(value, axis=0) < 0
        if falling.any():
            index = _first_index(falling)
            raise CalibrationInputError(field, "must be non-decreasing", (index[0] + 1, *index[1:]))
    return value


def state_number(value: Any, name: str, low: float | None = None, positive: bool = False) -> float:
    """A learned number checked: finite, and ``>= low`` or ``> 0`` when asked (an array of
    one number, as packed components hold their numbers, counts as that number)."""
    if isinstance(value, np.ndarray) and value.shape == (1,):
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise CalibrationInputError(f"state.{name}", "must be a finite number")
    if positive and not value > 0:
        raise CalibrationInputError(f"state.{name}", "must be positive")
    if low is not None and value < low:
        raise CalibrationInputError(f"state.{name}", f"must be at least {low:g}")
    return float(value)


def check_min_probability(value: Any, field: str = "options.min_probability") -> None:
    """The ``min_probability`` option of the step methods: null (automatic) or a number in [0, 0.5)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 0.5):
        raise CalibrationInputError(field, "must be null (automatic: 1 / (2 (n + 1))) or a number from 0 to below 0.5")


def keep_off_edges(values: np.ndarray, min_probability: float | None, n_rows: int) -> np.ndarray:
    """Learned output probabilities clipped to [m, 1 - m], so that no prediction is exactly 0 or 1.

    The step methods (isotonic, histograms, Venn-Abers) learn block or bin means, which are 0
    or 1 wherever a block saw one class only; one test row of the other class then costs an
    infinite log loss. The automatic floor (``min_probability`` null) is m = 1 / (2 (n + 1))
    for a holdout of n rows: the posterior mean of a probability under the Jeffreys prior
    Beta(1/2, 1/2) after n rows of which none was positive, that is the most extreme
    probability n rows can support. It shrinks as the holdout grows (5e-4 at n = 1,000), so
    that it changes ECE and Brier score by at most m. ``min_probability`` 0 keeps the raw means.
    """
    m = 0.5 / (n_rows + 1) if min_probability is None else float(min_probability)
    return np.clip(values, m, 1.0 - m) if m > 0 else values


def check_holdout(labels: np.ndarray, weights: np.ndarray, min_samples: int, n_classes: int = 2) -> None:
    """Reject holdouts that are too small, or that cannot be cross-fitted.

    Binary holdouts need both classes, multiclass ones at least two; every
    class present needs two rows, so that each cross-fitting fold's training
    part contains it.
    """
    n = labels.shape[0]
    if n < min_samples:
        raise CalibrationInputError("scores", f"needs at least {min_samples} samples, got n_samples={n}")
    counts = np.bincount(labels[weights > 0], minlength=n_classes)
    present = np.flatnonzero(counts)
    if n_classes == 2 and present.shape[0] < 2:
        missing = int(np.flatnonzero(counts == 0)[0])
        raise CalibrationInputError("labels", f"both classes are needed but no label is {missing}")
    if present.shape[0] < 2:
        raise CalibrationInputError("labels", "at least two classes must be present")
    rare = np.flatnonzero(counts == 1)
    if rare.shape[0]:
        raise CalibrationInputError(
            "labels", f"each class present needs at least 2 samples (cross-fitting); label {int(rare[0])} has 1"
        )


@dataclass(frozen=True)
class ArraySpec:
    """An extra named array a method takes beside the scores (``features``, ``X``, ...).

    ``rows``: one entry per holdout row (so cross-fitting splits it by fold);
    otherwise the array is passed whole to every fit.
    """

    ndim: int
    rows: bool
    required: bool = True
    description: str = ""
    #: A column-wise object of named categorical and numeric columns (``calibd.calibration.columns``).
    columns: bool = False


def check_arrays(arrays: dict[str, Any], specs: dict[str, ArraySpec], n_samples: int | None) -> dict[str, np.ndarray]:
    """Validate the extra arrays of a request against a method's declared specs."""
    for name in arrays:
        if name not in specs:
            expected = ", ".join(specs) or "none"
            raise CalibrationInputError(name, f"this method takes no array named {name!r} (it takes: {expected})")
    checked = {}
    for name, spec in specs.items():
        value = arrays.get(name)
        if value is None:
            if spec.required:
                raise CalibrationInputError(name, f"required by this method: {spec.description or 'an array'}")
            continue
        if spec.columns:
            from .columns import check_columns  # imports this module

            checked[name] = check_columns(value, name, n_samples if spec.rows else None)
            continue
        array = as_float_array(value, name, ndim=spec.ndim)
        if spec.rows and n_samples is not None and array.shape[0] != n_samples:
            raise CalibrationInputError(name, f"has {array.shape[0]} rows but scores has {n_samples}")
        checked[name] = array
    return checked


# Why some of scikit-learn's estimator checks do not apply (``Calibrator.expected_failed_checks``).
ONE_D_INDEXING = (
    "the check makes X 1-D for a one_d_array estimator, then indexes it as 2-D (X[:, 0] or X.shape[1]); "
    "tests/test_sklearn_checks.py checks the same property on 1-D scores"
)
ONE_D_INDEXING_CHECKS = (
    "check_dont_overwrite_parameters", "check_dtype_object", "check_estimator_sparse_array",
    "check_f_contiguous_array_estimator", "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_fit2d_1sample", "check_fit2d_1feature", "check_dict_unchanged", "check_fit2d_predict1d",
    "check_n_features_in", "check_n_features_in_after_fitting",
)
SEVERAL_COLUMNS = (
    "the check fits X of several columns; a binary calibrator takes one score per row "
    "(tests/test_sklearn_checks.py checks sample weights on 1-D scores)"
)
SEVERAL_COLUMN_CHECKS = (
    "check_sample_weights_shape", "check_sample_weights_not_overwritten", "check_sample_weight_equivalence_on_dense_data",
)
BLOBS = "the check's labels 0, 1, 2 name three classes but X has two score columns (one per class)"
BLOBS_CHECKS = ("check_estimators_overwrite_params", "check_estimators_fit_returns_self", "check_readonly_memmap_input")
FEW_ROWS_CHECKS = (
    "check_n_features_in_after_fitting", "check_estimators_nan_inf", "check_fit2d_1feature",
    "check_sample_weights_not_an_array", "check_sample_weights_shape", "check_sample_weights_not_overwritten",
    "check_sample_weights_pandas_series",
)
ONE_ROW_CLASS = (
    "integer weights on 15 rows leave a class on one row of positive weight; calibd needs two rows "
    "of each class present, so that cross-fitting's folds all see it"
)


def _column_names(X: Any) -> np.ndarray | None:
    """A DataFrame's column names, when they are all strings (scikit-learn's ``feature_names_in_``)."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray(list(columns), dtype=object)
    return names if names.shape[0] and all(isinstance(n, str) for n in names) else None


def _numbers_from_objects(array: np.ndarray, field: str) -> np.ndarray:
    """An object array of numbers as float64; anything else (None, str, bool, dict) is refused."""
    for index, value in enumerate(array.ravel()):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
            raise CalibrationInputTypeError(
                field,
                f"must contain only numbers; found {type(value).__name__!r} (an argument must be a real number; "
                "a string, a boolean or None is not a number)",
                tuple(int(i) for i in np.unravel_index(index, array.shape)),
            )
    return array.astype(np.float64)


def _labels_from_y(y: Any, n_classes: int) -> tuple[Any, np.ndarray | None]:
    """scikit-learn's ``y`` as labels, and ``classes_`` when they are not 0..K-1.

    Labels that are column indices 0..K-1 are used as they are. Otherwise K distinct
    values are taken in sorted order (for binary labels, the second is the positive
    class), as scikit-learn classifiers order ``classes_`` and calibd orders class names.
    """
    labels = np.asarray(y)
    if labels.dtype.kind == "O":
        if all(isinstance(v, str) for v in labels.ravel()):
            labels = labels.astype(str)
        elif all(isinstance(v, Real) and not isinstance(v, (bool, np.bool_)) for v in labels.ravel()):
            labels = labels.astype(np.float64)
        else:
            raise CalibrationInputError("labels", "Unknown label type: labels must be numbers or strings")
    if labels.ndim == 1 and labels.dtype.kind in "iuf":
        values = np.unique(labels)
        indices = np.isin(values, np.arange(n_classes)).all()
        if not indices and values.shape[0] == n_classes and np.isfinite(values).all():
            return np.searchsorted(values, labels).astype(np.int32), values
    return labels, None


def n_classes_of(scores: np.ndarray, tasks: tuple[str, ...]) -> int:
    """2 for flat binary scores and multivariate rows; K for multiclass rows of K."""
    return scores.shape[1] if scores.ndim == 2 and "multiclass" in tasks else 2


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
