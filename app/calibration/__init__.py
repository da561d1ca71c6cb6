"""Calibration methods: pure numpy/scipy, one module each, registered by name.

    >>> from calibd.calibration import get_method
    >>> calibrator = get_method("platt")(input="probability").fit(scores, labels)
    >>> calibrator.predict(new_scores)
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
