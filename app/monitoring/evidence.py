"""A monitor's segments ranked by evidence of miscalibration, not by raw ECE.

A segment's ECE shrinks like 1 / sqrt(rows) under perfect calibration, so a
28-row segment heads a list ranked by ECE on noise alone. Ranked here, as MCE
ranks segments, by the error over its noise: from a window's sums,

    sd    = sqrt(brier / samples)      (brier estimates mean p (1 - p), the label's variance, under calibration)
    sigma = ece / sd
    mde   = 5 sd                       (minimum detectable error, MCGrad's 5 sigma)

``ece`` is the window's binned ECE (15 bins), so sigma is the binned analogue
of ECCE's sigma (``calibd.metrics.multicalibration``): comparable between
segments, not a calibrated p-value. ``mde`` says how small an error this
segment's labels could show at all.
"""

from __future__ import annotations

import math
from typing import Any

from ..metrics.multicalibration import MDE_SIGMAS

#: The window whose figures rank the segments (the monitor's count window).
RANKING_WINDOW = "last_10000"


def segment_evidence(window: dict[str, Any]) -> dict[str, float | None]:
    """``{"sigma", "mde"}`` of one window's metrics (``window_metrics``); None where it has no labels or no variance."""
    samples, ece, brier = window.get("samples") or 0, window.get("ece"), window.get("brier")
    if not samples or ece is None or brier is None or brier <= 0:
        return {"sigma": None, "mde": None}
    sd = math.sqrt(brier / samples)
    return {"sigma": ece / sd, "mde": MDE_SIGMAS * sd}


def rank_segments(segments: list[dict[str, Any]], window: str = RANKING_WINDOW) -> list[dict[str, Any]]:
    """Each segment (``{"windows": {window: metrics}, ...}``) with ``evidence`` (``{"window", "sigma", "mde"}``)
    added, the strongest evidence first (ties, and segments without labels, by more labels)."""
    for segment in segments:
        segment["evidence"] = {"window": window, **segment_evidence(segment["windows"].get(window, {}))}

    def key(segment: dict[str, Any]) -> tuple[float, int]:
        sigma = segment["evidence"]["sigma"]
        return (-1.0 if sigma is None else sigma, segment["windows"].get(window, {}).get("samples") or 0)

    return sorted(segments, key=key, reverse=True)
