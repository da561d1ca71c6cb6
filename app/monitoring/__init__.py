"""Monitoring of calibration in production: anytime-valid drift tests."""

from .drift import DriftResult, DriftTest, ParallelDriftResult, ParallelDriftTests

__all__ = ["DriftResult", "DriftTest", "ParallelDriftResult", "ParallelDriftTests"]
