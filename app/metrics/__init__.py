"""Calibration metrics: pure numpy/scipy estimators of calibration error, proper scores,
bootstrap intervals and reliability-diagram data. No web or database imports.

Every public function takes ``probabilities`` ((n,) binary, probability of
class 1; or (n, K) rows), ``labels`` (0/1, or 0..K-1) and optional
``sample_weight``, validates them, and raises
``calibd.inputs.CalibrationInputError`` naming the bad field.
``evaluate`` computes them all in the shape of ``POST /evaluate``.
"""

# calibd.calibration imports ece, brier and log_loss from here for its fit summaries;
# nothing in this package imports calibd.calibration (both build on calibd.inputs).
from .binned import ace, bin_edges, ece
from .bootstrap import bootstrap_ci
from .debiased import debiased_l2_ce
from .evaluate import DEFAULT_METRICS, METRICS, evaluate
from .inputs import Prepared, prepare
from .lp import lp_error
from .multicalibration import multicalibration_error
from .reliability import reliability_diagram, wilson_interval
from .scores import brier, brier_decomposition, log_loss
from .smooth import smooth_ece
from .unbinned import interval_calibration, ks_error, spiegelhalter

__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "Prepared",
    "ace",
    "bin_edges",
    "bootstrap_ci",
    "brier",
    "brier_decomposition",
    "debiased_l2_ce",
    "ece",
    "evaluate",
    "interval_calibration",
    "ks_error",
    "log_loss",
    "lp_error",
    "multicalibration_error",
    "prepare",
    "reliability_diagram",
    "smooth_ece",
    "spiegelhalter",
    "wilson_interval",
]
