"""Temperature scaling: divide the logits by one learned temperature.

    binary:      p' = sigmoid(z / T)
    multiclass:  p' = softmax(z / T),   z the K logits of a row

Guo, Pleiss, Sun & Weinberger (2017), "On calibration of modern neural
networks". T is fitted by maximum (weighted) likelihood on the holdout.

Binary temperature scaling is Platt scaling without the bias term, fitted by
Newton's method on the slope 1/T (``_logistic.fit_logistic``).

Multiclass: with beta = 1/T the mean log-loss

    L(beta) = sum_i w_i [logsumexp(beta z_i) - beta z_{i, y_i}] / sum_i w_i

is convex in beta, with L'(beta) = mean_i (E_{p_i}[z] - z_{i, y_i}) and
L''(beta) = mean_i Var_{p_i}(z), p_i = softmax(beta z_i). Both come from the
same exp pass, so a safeguarded Newton iteration on beta (a bracket kept on
the sign of L', bisection in log beta when a Newton step leaves it) converges
in a handful of passes over the data: n = 100,000 rows of K = 100 in well
under a second. T is bounded to [1e-3, 1e3]; a holdout whose best T lies
beyond a bound gets the bound (e.g. logits that rank the true class last
want T -> infinity, which no temperature expresses).

With ``input="probability"`` the logits are log(max(p, 1e-12)): softmax(log p / T)
renormalises p ** (1/T). Rows of two columns give the same model as binary
scores (softmax of two logits is the sigmoid of their difference).
"""

from __future__ import annotations

import numpy as np

from . import kernels
from ._fastpath import plain_array, quick_extremes
from ._logistic import fit_logistic
from ._multiclass import MAX_TEMPERATURE, MIN_TEMPERATURE, as_logits, fit_inverse_temperature, softmax
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import sigmoid, to_logit
from .validation import state_number


class TemperatureCalibrator(Calibrator):
    """Temperature scaling: p' = softmax(z / T) for rows of K logits, sigmoid(z / T) for binary scores.

    One T > 0, fitted by maximum (weighted) likelihood; it changes no row's argmax.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on: probabilities (rows summing to 1 for multiclass) or logits.

    Attributes
    ----------
    temperature_ : float
        T, fitted by maximum (weighted) likelihood on the holdout.

    References
    ----------
    C. Guo, G. Pleiss, Y. Sun and K. Weinberger, "On calibration of modern neural networks",
    ICML 2017.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.temperature import TemperatureCalibrator
    >>> calibrator = TemperatureCalibrator(input="logit").fit(logits, labels)
    >>> round(calibrator.temperature_, 3)
    2.044
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)  # the truth: 0.665, 0.245, 0.09
    array([[0.659, 0.248, 0.093]])
    """

    method = "temperature"
    tasks = ("binary", "multiclass")
    fitted_attributes = ("temperature_",)

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        if scores.ndim == 2:
            beta, _ = fit_inverse_temperature(as_logits(scores, self.input), labels, weights)
            self.temperature_ = float(min(max(1.0 / beta, MIN_TEMPERATURE), MAX_TEMPERATURE))
            return
        z = to_logit(scores, self.input)
        (inverse_temperature,) = fit_logistic(z[:, None], labels.astype(np.float64), weights, init=[1.0])
        # A negative slope would mean the scores rank the classes backwards; a
        # temperature cannot express that, so the closest it gets is T -> inf.
        self.temperature_ = float(1.0 / inverse_temperature) if inverse_temperature > 1e-12 else 1e12

    def predict_compiled(self, scores):
        if self.input != "logit" or not hasattr(self, "temperature_"):
            return None
        return kernels.softmax(scores, self.temperature_, getattr(self, "n_classes_", 2))

    def predict_details(self, scores, **arrays):
        # The hot path: logit rows of K columns, valid as they stand, by the compiled kernel or
        # in five numpy calls.
        k = getattr(self, "n_classes_", 2)
        if not arrays and (probabilities := self.predict_compiled(scores)) is not None:
            return probabilities, {}
        if not arrays and hasattr(self, "temperature_") and plain_array(scores, self.input, ndim=2, n_columns=k):
            t = self.temperature_
            # Every |z| is at most ||z||_2, so a sum of squares below (600 T)^2 shows in one
            # pass that all logits are finite and within the unshifted softmax's range (a NaN
            # or an infinity fails the comparison). Larger batches, which may exceed the bound
            # while valid (and would wake BLAS threads), are checked by their extremes instead.
            if scores.size <= _VDOT_MAX and np.vdot(scores, scores) < (_UNSHIFTED_RANGE * t) ** 2:
                return _unshifted_softmax(scores / t), {}
            extremes = quick_extremes(scores, self.input, ndim=2, n_columns=k)
            if extremes is not None:
                low, high = extremes
                return _softmax_in_place(scores / t, low / t, high / t), {}
        return super().predict_details(scores, **arrays)

    def check_predict_scores(self, scores):
        checked = super().check_predict_scores(scores)
        # The base checks the column count for K >= 3 only (K = 2 also takes flat scores).
        k = getattr(self, "n_classes_", None)
        if k is not None and checked.ndim == 2 and checked.shape[1] != k:
            raise CalibrationInputError(
                "scores", f"rows have {checked.shape[1]} columns but this calibrator was fitted on {k}", (0,)
            )
        return checked

    def _check_state(self) -> None:
        state_number(self.temperature_, "temperature_", positive=True)

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        if scores.ndim == 2:
            probabilities = self.predict_compiled(scores)  # the bits /calibrate's kernel gives
            if probabilities is not None:
                return probabilities
            return _softmax_in_place(as_logits(scores, self.input) / self.temperature_)
        return sigmoid(to_logit(scores, self.input) / self.temperature_)

    def fit_info(self) -> dict:
        return {"temperature": self.temperature_}


#: np.vdot (a sum of squares in one BLAS call, raveling a C-contiguous array without copying) is
#: single-threaded in OpenBLAS up to this many elements.
_VDOT_MAX = 10_000

#: |logit / T| below this: exp neither overflows (a row's sum stays finite) nor leaves the normal floats.
_UNSHIFTED_RANGE = 600.0


def _softmax_in_place(z: np.ndarray, low: float | None = None, high: float | None = None) -> np.ndarray:
    """``softmax(z)`` by rows, overwriting z (a temporary), the same to a few ulps.

    softmax subtracts each row's maximum before exp, so that exp cannot
    overflow; when every |z| < 600 no shift is needed (every exp is a normal
    float, so each row's ratios keep full precision), which saves the
    row-wise maximum, the costliest step on small batches. ``low`` and
    ``high``, z's extremes when the caller already knows them, save two passes.
    """
    if low is None or high is None:
        low, high = float(z.min()), float(z.max())
    if not max(high, -low) < _UNSHIFTED_RANGE:  # also NaN
        # Rows within range still take the unshifted form and only the others are shifted, so
        # that no row's answer depends on the rows batched with it (to the last bit).
        far = ~(np.abs(z).max(axis=1) < _UNSHIFTED_RANGE)
        z[~far] = _unshifted_softmax(z[~far])
        z[far] = softmax(z[far])
        return z
    return _unshifted_softmax(z)


def _unshifted_softmax(z: np.ndarray) -> np.ndarray:
    """``softmax(z)`` by rows, overwriting z, for |z| < 600 (no shift needed)."""
    np.exp(z, out=z)
    z /= np.add.reduce(z, axis=1, keepdims=True)
    return z
