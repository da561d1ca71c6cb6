"""Calibration methods: pure numpy/scipy, one module each, registered by name.

    >>> from calibd.calibration import get_method
    >>> scores, labels = [0.1, 0.3, 0.4, 0.6, 0.7, 0.9] * 2, [0, 0, 1, 0, 1, 1] * 2
    >>> calibrator = get_method("platt")(input="probability").fit(scores, labels)
    >>> calibrator.predict([0.2, 0.8]).round(2)
    array([0.11, 0.89])
"""

from ..inputs import CalibrationInputError
from .base import Calibrator, NotFittedError
from .fitting import FitResult, fit_calibrator
from .registry import METHODS, from_dict, get_method

__all__ = [
    "METHODS",
    "CalibrationInputError",
    "Calibrator",
    "FitResult",
    "NotFittedError",
    "fit_calibrator",
    "from_dict",
    "get_method",
]
