"""Platt scaling: a logistic regression on the score's logit.

    p' = sigmoid(A * z + B),   z = log(p / (1 - p))  (or the score itself for logits)

A and B maximise the weighted log-likelihood of the holdout labels.
Platt (1999), "Probabilistic outputs for support vector machines".
"""

from __future__ import annotations

import numpy as np

from ._logistic import fit_logistic
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import sigmoid, to_logit
from .validation import state_number


class PlattCalibrator(Calibrator):
    """Platt scaling: p' = sigmoid(A z + B), z = log(p / (1 - p)) (or the score, for logits).

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    smooth_targets : bool, default=False
        Fit to Platt's smoothed targets (N+ + 1)/(N+ + 2) and 1/(N- + 2) instead of 0/1, as
        scikit-learn's sigmoid calibration does; it keeps A finite on separable holdouts.

    Attributes
    ----------
    a_ : float
        The slope A.
    b_ : float
        The offset B.

    References
    ----------
    J. Platt, "Probabilistic outputs for support vector machines and comparisons to
    regularized likelihood methods", 1999.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.platt import PlattCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = PlattCalibrator().fit(scores, labels)
    >>> round(calibrator.a_, 3), round(calibrator.b_, 3)
    (1.432, -1.241)
    >>> calibrator.predict([0.2, 0.5, 0.8]).round(3)
    array([0.038, 0.224, 0.678])
    """

    method = "platt"
    fitted_attributes = ("a_", "b_")

    def __init__(self, input: str = "probability", smooth_targets: bool = False):
        self.input = input
        self.smooth_targets = smooth_targets

    def _check_params(self) -> None:
        if not isinstance(self.smooth_targets, bool):
            raise CalibrationInputError("options.smooth_targets", "must be true or false")

    def _check_state(self) -> None:
        state_number(self.a_, "a_")
        state_number(self.b_, "b_")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        z = to_logit(scores, self.input)
        targets = labels.astype(np.float64)
        if self.smooth_targets:
            n_pos = float(np.count_nonzero(labels))
            n_neg = labels.shape[0] - n_pos
            targets = np.where(labels == 1, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
        features = np.column_stack([z, np.ones_like(z)])
        self.a_, self.b_ = (float(c) for c in fit_logistic(features, targets, weights, init=[1.0, 0.0]))

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return sigmoid(self.a_ * to_logit(scores, self.input) + self.b_)

    def fit_info(self) -> dict:
        return {"a": self.a_, "b": self.b_}
