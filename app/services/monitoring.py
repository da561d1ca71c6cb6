"""The monitors: fed mature labelled predictions in prediction-time order, and read back.

``update`` adds rows to the window sums (bucketed by the minute their
predictions were served), the version's drift test and its segment monitors,
in the caller's transaction. ``monitor`` reads a version's windows, drift test,
segments and label timing for the API and /metrics.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from ..monitoring import label_delay
from ..monitoring.drift import DriftTest
from ..monitoring.evidence import rank_segments
from ..monitoring.segment_drift import SegmentDriftTest
from ..monitoring.windows import WINDOWS, BinSums, feedback_terms, metrics_table, window_metrics
from ..storage import maturity as maturity_store
from ..storage import monitor_state
from ..storage import segments as segment_store
from ..storage.repository import Sessions
from ..storage.sql import NotFound, insert_for


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
    if predicted_at.count(predicted_at[0]) == n:  # one time for all (feedback without prediction times)
        groups[monitor_state.minute(predicted_at[0])] = list(range(n))
    else:
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
    return _drift_view(state, updated_at)


def _drift_view(state: dict[str, Any], updated_at: datetime | None) -> dict[str, Any]:
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


def _segment_drift_view(row: dict[str, Any]) -> dict[str, Any]:
    """A segment test as the routes show it: its row, its threshold log(1/alpha_j) and what it has seen."""
    state = row.get("state")
    if SegmentDriftTest.is_state(state):
        result = SegmentDriftTest.from_dict(state).result()
    else:  # a test of the earlier design (each its own fixed alpha), or none yet
        result = DriftTest.from_dict(state).result() if state else None
    return {
        "alarm": row["alarm"],
        "log_evalue": row["log_evalue"],
        "threshold": None if result is None else result.log_threshold,
        "alpha": row["alpha"],
        "samples": 0 if result is None else result.n_samples,
        "batches": 0 if result is None else result.n_batches,
        "alarm_batch": None if result is None else result.alarm_batch,
        "top_alternative": None if result is None else result.top_alternative,
        "updated_at": row["updated_at"],
    }


def windows_end(settings: maturity_store.LabelSettings) -> datetime | None:
    """Where a version's time windows end: now, or (a label window) where its predictions are mature."""
    return settings.matured_through if settings.window_seconds is not None else None


def monitor(
    sessions: Sessions, calibrator_id: int, version: int, binary: bool, alpha: float, history_hours: int = 0,
    name: str | None = None,
) -> dict[str, Any]:
    """A version's windows, drift test, segments and label timing (and ``history_hours`` of hourly
    metrics), all read from one snapshot. NotFound when the version went away meanwhile."""
    state = monitor_state.read_version(sessions, calibrator_id, version, history_hours)
    if state is None:
        raise NotFound(name or f"#{calibrator_id}", version)
    segments = [
        {
            "dimension": dimension,
            "segment": segment,
            "windows": {w: window_metrics(found.sums[w], binary=binary) for w in WINDOWS},
            "drift": _segment_drift_view(found.drift),
        }
        for (dimension, segment), found in sorted(state.segments.items())
    ]
    # ranked by evidence (ECE over its noise), not raw ECE: a small segment's ECE is large on noise alone
    segments = rank_segments(segments)
    timing = _label_timing_view(state.labels, binary)
    timing.pop("_windows_end")
    out = {
        "windows": {w: window_metrics(state.sums[w], binary=binary) for w in WINDOWS},
        "drift": _drift_view(state.drift.get("state") or {}, state.drift["updated_at"]) | {"threshold": math.log(1.0 / alpha)},
        "segments": segments,
        "labels": timing,
    }
    if history_hours:
        out["history"] = [{"hour": hour, **window_metrics(sums, binary)} for hour, sums in state.history]
    return out


@dataclass
class CurrentMonitors:
    """The monitors of every calibrator's current version, as arrays (row i: ``names[i]``): what
    /metrics renders. Metrics are NaN where the monitor route shows null."""

    names: list[str]
    versions: list[int]
    #: window -> metric -> (rows,)
    windows: dict[str, dict[str, np.ndarray]]
    drift_alarm: np.ndarray
    drift_log_evalue: np.ndarray
    #: (row of the segment's version, dimension, segment)
    segments: list[tuple[int, str, str]]
    segment_windows: dict[str, dict[str, np.ndarray]]
    segment_alarm: np.ndarray
    segment_log_evalue: np.ndarray
    #: Each row's label timing, as the monitor route's ``labels``.
    labels: list[dict[str, Any]]


def current_monitors(sessions: Sessions) -> CurrentMonitors:
    """The monitors of every calibrator's current version, read in one snapshot by a few set-based
    queries, their metrics computed for all versions at once."""
    table = monitor_state.read_current(sessions)
    binary = table.n_classes == 2
    segment_rows = np.array([row for row, _, _ in table.segments], dtype=np.int64)
    return CurrentMonitors(
        names=table.names,
        versions=[version for _, version in table.keys],
        windows={w: metrics_table(table.sums[w], binary) for w in WINDOWS},
        drift_alarm=np.array([d["alarm"] for d in table.drift], dtype=bool),
        drift_log_evalue=np.array([d["log_evalue"] for d in table.drift], dtype=np.float64),
        segments=table.segments,
        segment_windows={w: metrics_table(table.segment_sums[w], binary[segment_rows]) for w in WINDOWS},
        segment_alarm=np.array([d["alarm"] for d in table.segment_drift], dtype=bool),
        segment_log_evalue=np.array([d["log_evalue"] for d in table.segment_drift], dtype=np.float64),
        labels=[_label_timing_view(backlog, bool(b)) for backlog, b in zip(table.labels, binary)],
    )


@functools.lru_cache(maxsize=4096)
def _compare_delays(positive: bytes, negative: bytes) -> label_delay.DelayComparison:
    """The delay test of two histograms (as bytes): /metrics asks it of every calibrator at each read,
    and a calibrator's histograms change only as its labels arrive."""
    return label_delay.compare_delays(np.frombuffer(positive, dtype=np.int64), np.frombuffer(negative, dtype=np.int64))


#: The setting a user changes when delays depend on the label.
WINDOW_SETTING = "labels.window"


def _label_timing_view(backlog: maturity_store.Backlog, binary: bool) -> dict[str, Any]:
    """The label window, the backlog waiting for maturity, the counts of maturity, the label delays per
    label value, and (labels final on arrival) whether positives' and negatives' delays differ."""
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
        comparison = _compare_delays(histograms.get(1, empty).tobytes(), histograms.get(0, empty).tobytes())
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
