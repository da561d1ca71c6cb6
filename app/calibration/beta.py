"""Beta calibration: a logistic regression on ln p and -ln(1 - p).

    p' = sigmoid(a * ln p - b * ln(1 - p) + c),   a, b >= 0

which is the family of ratios of two beta densities (the likelihood ratio of
class-conditional beta-distributed scores). With a = b it is Platt scaling on
the logit; with a, b >= 0 it is non-decreasing in p. The midpoint m, where
p'(m) = 1/2, solves c = b ln(1 - m) - a ln m.
Kull, Silva Filho & Flach (2017), "Beta calibration: a well-founded and easily
implemented improvement on logistic calibration for binary classifiers",
AISTATS. Reference implementation: PyPI ``betacal`` (version 1.1.0 read).

Variants (option ``variant``), as ``betacal`` defines them:

- ``abm`` (default): a, b, c free. Fit the unconstrained logistic regression
  on (ln p, -ln(1 - p), 1); if a < 0, drop ln p (a = 0) and refit on
  (-ln(1 - p), 1); else if b < 0, drop -ln(1 - p) (b = 0) and refit on
  (ln p, 1). This is betacal's rule, in its order (a is checked first).
- ``ab``: m fixed at 1/2. Features ln(2p) and ln(2(1 - p)) with no
  intercept; a is the first coefficient and b minus the second, so
  c = (a - b) ln 2 and p'(1/2) = 1/2.
- ``am``: a = b. One feature, the logit ln(p / (1 - p)), with an intercept:
  Platt scaling; m = 1 / (1 + exp(c / a)).

Where this departs from betacal: betacal does not check the sign of the
refitted coefficient in ``abm``, nor any sign in ``ab`` and ``am``, so on
scores that rank the classes backwards it can return a negative a or b (a
decreasing map). Here a coefficient that is still negative is dropped too,
the same way; when nothing is left the fit is the constant weighted base
rate (``abm``, ``am``) or 1/2 (``ab``, whose m is pinned). So a, b >= 0
always and the output is non-decreasing in the score. On every holdout where
betacal's coefficients come out non-negative, the fitted model is the same
maximum-likelihood fit (betacal's ``LogisticRegression(C=99999999999)`` with
lbfgs stops at its default tolerance, so agreement is to about 1e-4, not
machine precision). betacal clips p to [2.2e-16, 1 - 2.2e-16]; here
[1e-12, 1 - 1e-12] as in the rest of calibd, which only matters for scores
within 1e-12 of 0 or 1. Sample weights are used, as in betacal 1.1.0.

Fitted by Newton's method (``fit_logistic``) on at most three features.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import brentq

from ._logistic import fit_logistic
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import EPS, sigmoid
from .validation import state_number

VARIANTS = ("abm", "ab", "am")
_LN2 = float(np.log(2.0))
# |logit| of the clipped probabilities [EPS, 1 - EPS].
_MAX_LOGIT = float(np.log1p(-EPS) - np.log(EPS))


def log_probabilities(scores: np.ndarray, input: str) -> tuple[np.ndarray, np.ndarray]:
    """(ln p, ln(1 - p)) with p clipped to [EPS, 1 - EPS], computed without cancellation.

    For logits, ln p = -log(1 + e^-z) and ln(1 - p) = -log(1 + e^z), so a
    logit of -30 gives ln p = -30 rather than log of a rounded sigmoid.
    """
    if input == "logit":
        z = np.clip(scores, -_MAX_LOGIT, _MAX_LOGIT)
        return -np.logaddexp(0.0, -z), -np.logaddexp(0.0, z)
    p = np.clip(scores, EPS, 1.0 - EPS)
    return np.log(p), np.log1p(-p)


def beta_midpoint(a: float, b: float, c: float) -> float | None:
    """The m in (0, 1) with c = b ln(1 - m) - a ln m (where p' = 1/2); None if there is none."""
    if a > 0 and b > 0:
        # g(u) = b ln(1 - m) - a ln m - c with m = sigmoid(u) is strictly
        # decreasing from +inf to -inf: bracket its root on the logit scale.
        def g(u: float) -> float:
            return float(a * np.logaddexp(0.0, -u) - b * np.logaddexp(0.0, u) - c)

        lo, hi = -1.0, 1.0
        while g(lo) < 0 and lo > -1e300:
            lo *= 2.0
        while g(hi) > 0 and hi < 1e300:
            hi *= 2.0
        if not g(lo) >= 0 >= g(hi):  # a or b so small that the root is beyond any float
            return None
        return float(sigmoid(np.float64(brentq(g, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps))))
    if a > 0 and b == 0:  # c = -a ln m
        return float(np.exp(-c / a)) if c >= 0 else None
    if a == 0 and b > 0:  # c = b ln(1 - m)
        return float(-np.expm1(c / b)) if c <= 0 else None
    return None


class BetaCalibrator(Calibrator):
    """Beta calibration: p' = sigmoid(a ln p - b ln(1 - p) + c), a, b >= 0.

    A logistic regression on ln p and -ln(1 - p), fitted by maximum (weighted) likelihood;
    a coefficient that comes out negative is dropped and the rest refitted, so the map is
    non-decreasing.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    variant : {"abm", "ab", "am"}, default="abm"
        ``"abm"``: a, b and c fitted; ``"ab"``: the midpoint m (where p' = 1/2) fixed at 1/2;
        ``"am"``: a = b, which is Platt scaling on the logit.

    Attributes
    ----------
    a_ : float
        The weight of ln p, >= 0.
    b_ : float
        The weight of -ln(1 - p), >= 0.
    c_ : float
        The intercept (whatever the variant, the model is written in this form).

    References
    ----------
    M. Kull, T. Silva Filho and P. Flach, "Beta calibration: a well-founded and easily
    implemented improvement on logistic calibration for binary classifiers", AISTATS 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.beta import BetaCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = BetaCalibrator().fit(scores, labels)
    >>> round(calibrator.a_, 3), round(calibrator.b_, 3), round(calibrator.c_, 3)
    (2.716, 0.769, 0.174)
    >>> calibrator.predict([0.2, 0.5, 0.8]).round(3)
    array([0.018, 0.236, 0.691])
    """

    method = "beta"
    fitted_attributes = ("a_", "b_", "c_")

    def __init__(self, input: str = "probability", variant: str = "abm"):
        self.input = input
        self.variant = variant

    def _check_params(self) -> None:
        if not isinstance(self.variant, str) or self.variant not in VARIANTS:
            raise CalibrationInputError("options.variant", f"must be one of {', '.join(map(repr, VARIANTS))}")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        log_p, log_1mp = log_probabilities(scores, self.input)
        targets = labels.astype(np.float64)
        rate = float(np.dot(weights, targets) / weights.sum())
        base_logit = float(np.log(rate) - np.log1p(-rate))
        ones = np.ones_like(log_p)
        if self.variant == "abm":
            a, b, c = fit_logistic(np.column_stack([log_p, -log_1mp, ones]), targets, weights, init=[1.0, 1.0, 0.0])
            if a < 0:
                a = 0.0
                b, c = fit_logistic(np.column_stack([-log_1mp, ones]), targets, weights, init=[1.0, 0.0])
                if b < 0:
                    b, c = 0.0, base_logit
            elif b < 0:
                b = 0.0
                a, c = fit_logistic(np.column_stack([log_p, ones]), targets, weights, init=[1.0, 0.0])
                if a < 0:
                    a, c = 0.0, base_logit
        elif self.variant == "ab":
            # eta = a ln(2p) - b ln(2(1 - p)) = a ln p - b ln(1 - p) + (a - b) ln 2
            x_a, x_b = log_p + _LN2, -(log_1mp + _LN2)
            a, b = fit_logistic(np.column_stack([x_a, x_b]), targets, weights, init=[1.0, 1.0])
            if a < 0:
                a = 0.0
                (b,) = fit_logistic(x_b[:, None], targets, weights, init=[1.0])
                b = max(b, 0.0)
            elif b < 0:
                b = 0.0
                (a,) = fit_logistic(x_a[:, None], targets, weights, init=[1.0])
                a = max(a, 0.0)
            c = (a - b) * _LN2
        else:  # "am": a = b, Platt scaling on the logit
            a, c = fit_logistic(np.column_stack([log_p - log_1mp, ones]), targets, weights, init=[1.0, 0.0])
            if a < 0:
                a, c = 0.0, base_logit
            b = a
        self.a_, self.b_, self.c_ = float(a), float(b), float(c)

    def _check_state(self) -> None:
        for name in ("a_", "b_", "c_"):
            state_number(getattr(self, name), name)

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        log_p, log_1mp = log_probabilities(scores, self.input)
        return sigmoid(self.a_ * log_p - self.b_ * log_1mp + self.c_)

    def fit_info(self) -> dict[str, Any]:
        m = 0.5 if self.variant == "ab" and (self.a_ > 0 or self.b_ > 0) else beta_midpoint(self.a_, self.b_, self.c_)
        return {"variant": self.variant, "a": self.a_, "b": self.b_, "c": self.c_, "m": m}
