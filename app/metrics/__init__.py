"""Calibration metrics: pure numpy estimators of calibration error and proper scores."""

from .binned import bin_edges, ece
from .scores import brier, log_loss

__all__ = ["bin_edges", "brier", "ece", "log_loss"]
