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

import math

import numpy as np

from ._logistic import fit_logistic
from ._multiclass import as_logits, softmax
from .base import Calibrator, CalibrationInputError, sigmoid, to_logit

#: Bounds of the multiclass temperature.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 1e3


def fit_inverse_temperature(
    z: np.ndarray, labels: np.ndarray, weights: np.ndarray, tol: float = 1e-10, max_iter: int = 100
) -> tuple[float, int]:
    """beta = 1/T minimising the weighted mean log-loss of softmax(beta z), and the passes used.

    Safeguarded Newton on the convex L(beta), in [1/MAX_TEMPERATURE, 1/MIN_TEMPERATURE].
    """
    n, k = z.shape
    w = weights / weights.sum()
    rows = np.arange(n)
    # Shift each row so that its largest logit is 0: exp(beta * zc) <= 1 for
    # every beta > 0, with no per-pass max.
    zc = z - z.max(axis=1, keepdims=True)
    zc_y = zc[rows, labels]
    buffer = np.empty_like(zc)

    def derivatives(beta: float) -> tuple[float, float]:
        np.multiply(zc, beta, out=buffer)
        np.exp(buffer, out=buffer)
        s = buffer.sum(axis=1)
        np.multiply(buffer, zc, out=buffer)
        m1 = buffer.sum(axis=1) / s  # E_p[z]
        m2 = np.einsum("ij,ij->i", buffer, zc) / s  # E_p[z^2]
        gradient = float(np.dot(w, m1 - zc_y))
        curvature = float(np.dot(w, np.maximum(m2 - m1 * m1, 0.0)))
        return gradient, curvature

    lower, upper = math.log(1.0 / MAX_TEMPERATURE), math.log(1.0 / MIN_TEMPERATURE)
    lo, hi = lower, upper
    # Work in t = log beta, keeping lo < optimum < hi from the sign of L'.
    t = 0.0
    passes = 0
    for _ in range(max_iter):
        beta = math.exp(t)
        gradient, curvature = derivatives(beta)
        passes += 1
        if gradient == 0.0 or (t >= upper and gradient < 0) or (t <= lower and gradient > 0):
            break  # the optimum, or a bound the optimum lies beyond
        if gradient > 0:
            hi = t  # L increasing here: the optimum is at smaller beta
        else:
            lo = t
        # A Newton step in beta (a step past 0 divides beta by 4 instead); it
        # stops the iteration when it is below tol. Bisection in t when the
        # step leaves the bracket, except that a step past a bound not yet
        # tried goes to that bound.
        candidate = beta - gradient / curvature if curvature > 0 else (math.inf if gradient < 0 else 0.0)
        new_t = math.log(candidate) if candidate > 0 else t - math.log(4.0)
        if abs(new_t - t) <= tol:
            t = min(max(new_t, lower), upper)
            break
        if new_t >= hi:
            new_t = upper if hi == upper else 0.5 * (lo + hi)
        elif new_t <= lo:
            new_t = lower if lo == lower else 0.5 * (lo + hi)
        if hi - lo <= tol:
            t = new_t
            break
        t = new_t
    return math.exp(t), passes


class TemperatureCalibrator(Calibrator):
    """Temperature scaling, binary (sigmoid(z/T)) and multiclass (softmax(z/T))."""

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

    def check_predict_scores(self, scores):
        checked = super().check_predict_scores(scores)
        # The base checks the column count for K >= 3 only (K = 2 also takes flat scores).
        k = getattr(self, "n_classes_", None)
        if k is not None and checked.ndim == 2 and checked.shape[1] != k:
            raise CalibrationInputError(
                "scores", f"rows have {checked.shape[1]} columns but this calibrator was fitted on {k}", (0,)
            )
        return checked

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        if scores.ndim == 2:
            return softmax(as_logits(scores, self.input) / self.temperature_)
        return sigmoid(to_logit(scores, self.input) / self.temperature_)

    def fit_info(self) -> dict:
        return {"temperature": self.temperature_}
