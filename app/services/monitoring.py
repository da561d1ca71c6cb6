"""The monitors: fed mature labelled predictions in prediction-time order, and read back.

``update`` adds rows to the window sums (bucketed by the minute their
predictions were served), the version's drift test and its segment monitors,
in the caller's transaction. ``monitor`` reads a version's windows, drift test,
segments and label timing for the API and /metrics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from ..monitoring import label_delay
from ..monitoring.drift import DriftTest
from ..monitoring.windows import WINDOWS, BinSums, feedback_terms, window_metrics
from ..storage import maturity as maturity_store
from ..storage import monitor_state
from ..storage import segments as segment_store
from ..storage.repository import Sessions
from ..storage.sql import insert_for


@dataclass(frozen=True)
class DriftSettings:
    alpha: float
    tolerance: float


def update(
    session: Session, calibrator_id: int, version: int, probabilities: np.ndarray, labels: np.ndarray,
    accepted: np.ndarray | None, predicted_at: list[datetime], segments: dict[str, np.ndarray] | None,
    drift: DriftSettings, now: datetime,
) -> None:
    """Add mature labelled rows of one version, in prediction-time order, to its monitors."""
    n = labels.shape[0]
    if not n:
        return
    terms = feedback_terms(probabilities, labels, accepted)
    groups: dict[datetime, list[int]] = defaultdict(list)
    for position, moment in enumerate(predicted_at):
        groups[monitor_state.minute(moment)].append(position)
    rows_probabilities = probabilities if probabilities.ndim == 2 else None
    parts = []
    for bucket, positions in groups.items():
        keep = slice(None) if len(groups) == 1 else np.asarray(positions)
        part = terms if len(groups) == 1 else feedback_terms(
            probabilities[keep], labels[keep], None if accepted is None else accepted[keep]
        )
        monitor_state.add_to_buckets(session, calibrator_id, version, bucket, BinSums.of(part))
        parts.append((bucket, keep, part))
    kept = np.ones(n, dtype=bool) if accepted is None else accepted
    if kept.any():
        # One bet per batch, on the rows in prediction-time order.
        row = monitor_state.lock_drift_state(session, calibrator_id, version, now)
        test = DriftTest.from_dict(row.state) if row.state else DriftTest(alpha=drift.alpha, tolerance=drift.tolerance)
        result = test.update(terms.probability[kept], terms.outcome[kept].astype(np.int8))
        row.state = test.to_dict()
        row.alarm = bool(result.alarm)
        row.log_evalue = float(result.log_evalue)
        row.updated_at = now
    if segments:
        for bucket, keep, part in parts:
            segment_store.store(
                session, calibrator_id, version, bucket, now, {k: v[keep] for k, v in segments.items()}, part,
                labels[keep], None if rows_probabilities is None else rows_probabilities[keep],
                drift.alpha, drift.tolerance, insert_for(session),
            )


def drift_summary(sessions: Sessions, calibrator_id: int, version: int) -> dict[str, Any]:
    """The drift test of one version: alarm, log e-value, and what it has seen."""
    state, updated_at = monitor_state.drift_state(sessions, calibrator_id, version)
    if not state:
        return {"alarm": False, "log_evalue": 0.0, "samples": 0, "batches": 0, "alarm_batch": None,
                "top_alternative": None, "updated_at": None}
    result = DriftTest.from_dict(state).result()
    return {
        "alarm": result.alarm,
        "log_evalue": result.log_evalue,
        "samples": result.n_samples,
        "batches": result.n_batches,
        "alarm_batch": result.alarm_batch,
        "top_alternative": result.top_alternative,
        "updated_at": updated_at,
    }


def windows_end(settings: maturity_store.LabelSettings) -> datetime | None:
    """Where a version's time windows end: now, or (a label window) where its predictions are mature."""
    return settings.matured_through if settings.window_seconds is not None else None


def monitor(sessions: Sessions, calibrator_id: int, version: int, binary: bool, alpha: float) -> dict[str, Any]:
    """A version's windows, drift test, segments and label timing."""
    timing = label_timing(sessions, calibrator_id, binary)
    end = timing.pop("_windows_end")
    sums = monitor_state.window_sums(sessions, calibrator_id, version, end)
    return {
        "windows": {w: window_metrics(sums[w], binary=binary) for w in WINDOWS},
        "drift": drift_summary(sessions, calibrator_id, version) | {"threshold": math.log(1.0 / alpha)},
        "segments": segment_store.monitors(sessions, calibrator_id, version, binary, end),
        "labels": timing,
    }


#: The setting a user changes when delays depend on the label.
WINDOW_SETTING = "labels.window"


def label_timing(sessions: Sessions, calibrator_id: int, binary: bool) -> dict[str, Any]:
    """The label window, the backlog waiting for maturity, the counts of maturity, the label delays per
    label value, and (labels final on arrival) whether positives' and negatives' delays differ."""
    backlog = maturity_store.backlog(sessions, calibrator_id)
    histograms = {}
    for label, bins in backlog.delays.items():
        counts = np.zeros(label_delay.N_DELAY_BINS, dtype=np.int64)
        for b, c in bins:
            counts[b] += c
        histograms[label] = counts
    delays = {
        str(label): {"count": int(counts.sum()), "p50_seconds": label_delay.quantile(counts, 0.5),
                     "p90_seconds": label_delay.quantile(counts, 0.9)}
        for label, counts in sorted(histograms.items())
    }
    settings = backlog.settings
    diagnostic = None
    mismatch = False
    if binary:
        empty = np.zeros(label_delay.N_DELAY_BINS, dtype=np.int64)
        comparison = label_delay.compare_delays(histograms.get(1, empty), histograms.get(0, empty))
        mismatch = comparison.differ and settings.window_seconds is None
        if mismatch:
            p90 = max(label_delay.quantile(histograms[1], 0.9) or 0.0, label_delay.quantile(histograms[0], 0.9) or 0.0)
            suggestion = label_delay.format_window(float(max(1, math.ceil(p90))))
            diagnostic = (
                f"label delay differs by label value: positives' median delay {delays['1']['p50_seconds']:.3g} s, "
                f"negatives' {delays['0']['p50_seconds']:.3g} s (chi-squared p={comparison.p_value:.2g}, "
                f"distance {comparison.distance:.2f}); labels are final on arrival, so the monitors see positives and "
                f"negatives in a biased order and the drift alarm can fire on a calibrated model. Set "
                f"{WINDOW_SETTING} (PUT /calibrators/{{name}}/labels) to at least the longest label delay, "
                f"e.g. \"{suggestion}\" or more."
            )
    return {
        "window": label_delay.format_window(settings.window_seconds),
        "window_seconds": settings.window_seconds,
        "missing": settings.missing,
        "matured_through": settings.matured_through,
        "waiting_predictions": backlog.waiting_predictions,
        "waiting_labels": backlog.waiting_labels,
        "late_labels": backlog.late_labels,
        "implied_negatives": backlog.implied_negatives,
        "unlabelled": backlog.unlabelled,
        "delays": delays,
        "delay_mismatch": mismatch,
        "diagnostic": diagnostic,
        "_windows_end": windows_end(settings),
    }
