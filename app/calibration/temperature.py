"""Temperature scaling: divide the logit by one learned temperature.

    p' = sigmoid(z / T)

Binary temperature scaling is Platt scaling without the bias term. T is
fitted by maximum likelihood on the holdout. Guo et al. (2017), "On
calibration of modern neural networks".
"""

from __future__ import annotations

import numpy as np

from ._logistic import fit_logistic
from .base import Calibrator, sigmoid, to_logit


class TemperatureCalibrator(Calibrator):
    method = "temperature"
    fitted_attributes = ("temperature_",)

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        z = to_logit(scores, self.input)
        (inverse_temperature,) = fit_logistic(z[:, None], labels.astype(np.float64), weights, init=[1.0])
        # A negative slope would mean the scores rank the classes backwards; a
        # temperature cannot express that, so the closest it gets is T -> inf.
        self.temperature_ = float(1.0 / inverse_temperature) if inverse_temperature > 1e-12 else 1e12

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return sigmoid(to_logit(scores, self.input) / self.temperature_)

    def fit_info(self) -> dict:
        return {"temperature": self.temperature_}
