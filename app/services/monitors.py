"""The monitors as the API shows them: window metrics, drift tests and segments of a version,
each read from one snapshot of the database (``storage.monitor_state``)."""

from __future__ import annotations

import math
from typing import Any

from ..monitoring.windows import WINDOWS, window_metrics
from ..storage import monitor_state
from ..storage.monitor_state import VersionState
from ..storage.repository import NotFound, Sessions


def version_monitors(
    sessions: Sessions, name: str, calibrator_id: int, version: int, alpha: float, history_hours: int = 0
) -> dict[str, Any]:
    """One version's windows, drift test (with its threshold log(1/alpha)), segments, and
    ``history_hours`` of hourly metrics. NotFound when the calibrator was deleted meanwhile."""
    state = monitor_state.read_version(sessions, calibrator_id, version, history_hours)
    if state is None:
        raise NotFound(name)
    binary = state.n_classes == 2
    out = view(state)
    out["drift"] = out["drift"] | {"threshold": math.log(1.0 / alpha)}
    out["history"] = [{"hour": hour, **window_metrics(sums, binary)} for hour, sums in state.history]
    return out


def current_monitors(sessions: Sessions) -> list[dict[str, Any]]:
    """Every calibrator's current version: name, version, windows, drift (alarm and log e-value), segments."""
    return [{"name": state.name, "version": state.version, **view(state)} for state in monitor_state.read_current(sessions)]


def view(state: VersionState) -> dict[str, Any]:
    binary = state.n_classes == 2
    segments = [
        {
            "dimension": dimension,
            "segment": segment,
            "windows": {w: window_metrics(found.sums[w], binary=binary) for w in WINDOWS},
            "drift": found.drift,
        }
        for (dimension, segment), found in sorted(state.segments.items())
    ]
    # The worst calibrated (last window's ECE) first.
    worst = WINDOWS[-1]
    segments.sort(key=lambda s: -1.0 if s["windows"][worst]["ece"] is None else s["windows"][worst]["ece"], reverse=True)
    return {
        "windows": {w: window_metrics(state.sums[w], binary=binary) for w in WINDOWS},
        "drift": state.drift,
        "segments": segments,
    }
