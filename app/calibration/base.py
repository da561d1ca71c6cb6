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
from typing import Any, ClassVar

import numpy as np

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


class NotFittedError(RuntimeError):
    """``predict`` was called before ``fit``."""


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.flatnonzero(mask.ravel())[0]), mask.shape))


def as_float_array(values: Any, field: str, ndim: int | tuple[int, ...] = 1) -> np.ndarray:
    """Convert to a finite float64 array of the given number of dimensions."""
    try:
        array = np.asarray(values)
    except ValueError:
        raise CalibrationInputError(field, "rows must all have the same length") from None
    if array.dtype.kind not in "fiu":
        raise CalibrationInputError(field, "must contain only numbers")
    array = np.ascontiguousarray(array, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if array.ndim not in allowed:
        shapes = " or ".join({1: "a flat list", 2: "a list of rows"}[d] for d in allowed)
        raise CalibrationInputError(field, f"must be {shapes}")
    if array.shape[0] == 0:
        raise CalibrationInputError(field, "must not be empty")
    finite = np.isfinite(array)
    if not finite.all():
        raise CalibrationInputError(field, "must be finite (no NaN or infinity)", _first_index(~finite))
    return array


def check_scores(scores: Any, input: str, field: str = "scores") -> np.ndarray:
    """Validate binary scores: a flat array of probabilities or logits."""
    scores = as_float_array(scores, field, ndim=1)
    if input == "probability":
        outside = (scores < 0.0) | (scores > 1.0)
        if outside.any():
            raise CalibrationInputError(
                field, "probabilities must lie in [0, 1]; send input='logit' for raw scores", _first_index(outside)
            )
    return scores


def check_binary_labels(labels: Any, n_samples: int, field: str = "labels") -> np.ndarray:
    """Validate 0/1 labels of the given length; returns an int8 array."""
    labels = as_float_array(labels, field, ndim=1)
    if labels.shape[0] != n_samples:
        raise CalibrationInputError(field, f"has {labels.shape[0]} entries but scores has {n_samples}")
    bad = (labels != 0.0) & (labels != 1.0)
    if bad.any():
        raise CalibrationInputError(field, "binary labels must be 0 or 1", _first_index(bad))
    return labels.astype(np.int8)


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


class Calibrator:
    """Base class of every calibration method.

    Subclasses set ``method`` (the registry name), override ``_fit`` and
    ``_predict``, list their learned attributes in ``fitted_attributes``, and
    may override ``_check_params`` to validate their options.
    """

    method: ClassVar[str]
    #: The input kinds this method accepts.
    inputs: ClassVar[tuple[str, ...]] = INPUT_KINDS
    #: The smallest holdout this method will fit.
    min_samples: ClassVar[int] = 10
    #: Learned attributes, saved by ``to_dict``.
    fitted_attributes: ClassVar[tuple[str, ...]] = ()
    #: True when the output is a non-decreasing function of the score.
    monotone: ClassVar[bool] = True

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
        valid = set(self._get_param_names())
        for name, value in params.items():
            if name not in valid:
                raise CalibrationInputError(f"options.{name}", f"unknown option for {self.method}")
            setattr(self, name, value)
        return self

    @classmethod
    def from_options(cls, input: str, options: dict[str, Any] | None = None) -> Calibrator:
        """Build from a service request's ``input`` and ``options``, rejecting unknown names."""
        options = dict(options or {})
        known = [name for name in cls._get_param_names() if name != "input"]
        for name in options:
            if name not in known:
                accepted = ", ".join(known) or "none"
                raise CalibrationInputError(
                    f"options.{name}", f"unknown option for {cls.method} (accepted: {accepted})"
                )
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

    def _check_fitted(self) -> None:
        missing = [a for a in self.fitted_attributes if not hasattr(self, a)]
        if missing:
            raise NotFittedError(f"{type(self).__name__} is not fitted yet; call fit first")

    # -- the contract -------------------------------------------------------
    def fit(self, scores: Any, labels: Any, sample_weight: Any = None, **arrays: Any) -> Calibrator:
        """Fit on a labelled holdout; labels are 0/1, weights optional."""
        self._validate_params()
        scores = check_scores(scores, self.input)
        labels = check_binary_labels(labels, scores.shape[0])
        weights = check_sample_weight(sample_weight, scores.shape[0])
        check_holdout(labels, weights, self.min_samples)
        self._fit(scores, labels, weights)
        self.n_classes_ = 2
        return self

    def predict(self, scores: Any, **arrays: Any) -> np.ndarray:
        """Calibrated probability of class 1 for each score, shape ``(n,)``."""
        self._check_fitted()
        return self._predict(check_scores(scores, self.input))

    def predict_proba(self, scores: Any, **arrays: Any) -> np.ndarray:
        """Calibrated probabilities of both classes, shape ``(n, 2)``."""
        p = self.predict(scores, **arrays)
        return np.column_stack([1.0 - p, p])

    def predict_details(self, scores: Any, **arrays: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``predict`` plus any per-row extras the method reports (``intervals``, ...)."""
        return self.predict(scores, **arrays), {}

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        raise NotImplementedError

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def fit_info(self) -> dict[str, Any]:
        """What the fit learned that a person would want to read (JSON types)."""
        return {}

    # -- serialisation --------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: method name, options and learned state."""
        self._check_fitted()
        state = {name: _to_json(getattr(self, name)) for name in self.fitted_attributes}
        return {"method": self.method, "params": self.get_params(), "state": state}

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> Calibrator:
        calibrator = cls(**params)
        for name in cls.fitted_attributes:
            setattr(calibrator, name, _from_json(state[name]))
        calibrator.n_classes_ = 2
        return calibrator


def check_holdout(labels: np.ndarray, weights: np.ndarray, min_samples: int) -> None:
    """Reject holdouts that are too small or hold only one class."""
    n = labels.shape[0]
    if n < min_samples:
        raise CalibrationInputError("scores", f"needs at least {min_samples} samples, got {n}")
    counts = np.bincount(labels[weights > 0], minlength=2)
    if (counts == 0).any():
        missing = int(np.flatnonzero(counts == 0)[0])
        raise CalibrationInputError("labels", f"both classes are needed but no label is {missing}")
    if (counts < 2).any():
        rare = int(np.flatnonzero(counts < 2)[0])
        raise CalibrationInputError("labels", f"each class needs at least 2 samples (cross-fitting); label {rare} has 1")


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
