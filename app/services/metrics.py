"""The process counters that services update (api/observability.py serves them with the rest)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FIT_DURATION = Histogram(
    "calibd_fit_duration_seconds", "Time to fit a calibrator, cross-fitted summary included", ["method"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
RECALIBRATION = Counter("calibd_recalibration_total", "Closed-loop recalibration steps", ["calibrator", "outcome"])
