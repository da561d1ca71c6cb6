"""Every calibration method by name. Adding a method means adding it here."""

from __future__ import annotations

from typing import Any

from .angular import AngularCalibrator
from .auto import AutoCalibrator
from ..inputs import CalibrationInputError
from .base import Calibrator
from .bernstein import BernsteinCalibrator
from .beta import BetaCalibrator
from .histogram import HistogramCalibrator
from .isotonic import IsotonicCalibrator
from .linear import DirichletCalibrator, MatrixScalingCalibrator, VectorScalingCalibrator
from .lp_patch import LpPatchCalibrator
from .multicalibration import MulticalibrationCalibrator
from .one_vs_rest import OneVsRestIsotonicCalibrator, OneVsRestPlattCalibrator
from .platt import PlattCalibrator
from .scaling_binning import ScalingBinningCalibrator
from .selective import SelectiveCalibrator
from .temperature import TemperatureCalibrator
from .top_label_histogram import TopLabelHistogramCalibrator
from .venn_abers import VennAbersCalibrator

METHODS: dict[str, type[Calibrator]] = {
    cls.method: cls
    for cls in (
        PlattCalibrator,
        TemperatureCalibrator,
        BetaCalibrator,
        IsotonicCalibrator,
        VennAbersCalibrator,
        HistogramCalibrator,
        ScalingBinningCalibrator,
        VectorScalingCalibrator,
        MatrixScalingCalibrator,
        DirichletCalibrator,
        OneVsRestIsotonicCalibrator,
        OneVsRestPlattCalibrator,
        TopLabelHistogramCalibrator,
        LpPatchCalibrator,
        SelectiveCalibrator,
        AngularCalibrator,
        BernsteinCalibrator,
        MulticalibrationCalibrator,
        AutoCalibrator,
    )
}


# auto chooses among the registered methods; handing it the table here keeps the imports one way.
AutoCalibrator.methods = METHODS


def get_method(name: str) -> type[Calibrator]:
    """The class registered under ``name``."""
    try:
        return METHODS[name]
    except KeyError:
        known = ", ".join(sorted(METHODS))
        raise CalibrationInputError("method", f"unknown method {name!r} (known: {known})") from None


def from_dict(data: dict[str, Any]) -> Calibrator:
    """Rebuild a fitted calibrator from ``Calibrator.to_dict`` output. Runs no stored code."""
    return get_method(data["method"]).from_dict(data)
