"""Prometheus metrics: request counters and latencies, and the monitors' gauges.

Counters and histograms live in this process (prometheus-client's
multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set, as ``calibd serve
--workers N`` does); the per-request ones are counted in plain numbers first
and added in batches (``pending_metrics``). The monitor gauges are read from the database at scrape
time, so every replica and every worker reports the same values.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import multiprocess
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..services import monitoring as monitoring_service
from ..storage import repository
from ..storage.repository import Sessions
from .auth import REQUIRE_READ, bearer
from .pending_metrics import PendingCounter, PendingHistogram
from .state import services

CALIBRATE_REQUESTS = Counter("calibd_calibrate_requests_total", "Calibrate requests served", ["calibrator"])
CALIBRATE_SCORES = Counter("calibd_calibrate_scores_total", "Scores calibrated", ["calibrator"])
FEEDBACK = Counter("calibd_feedback_total", "Labelled predictions recorded", ["calibrator"])
FEEDBACK_DUPLICATES = Counter(
    "calibd_feedback_duplicates_total", "Labels not recorded: their prediction id was labelled before", ["calibrator"]
)
FEEDBACK_UNMATCHED = Counter(
    "calibd_feedback_unmatched_total", "Labels whose prediction was not logged within the grace period", ["calibrator"]
)
FIT_DURATION = Histogram(
    "calibd_fit_duration_seconds", "Time to fit a calibrator, cross-fitted summary included", ["method"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
REQUEST_DURATION = Histogram(
    "calibd_request_duration_seconds", "HTTP request latency", ["route", "method", "status"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PREDICTION_LOG_DROPPED = Counter(
    "calibd_prediction_log_dropped_total", "Logged predictions dropped (database away or queue full)", ["calibrator"]
)
RECALIBRATION = Counter("calibd_recalibration_total", "Closed-loop recalibration steps", ["calibrator", "outcome"])

#: Monitor gauges: name -> (the window metric it reports, help text).
MONITOR_GAUGES = {
    "calibd_monitor_samples": ("samples", "Labelled predictions in the window"),
    "calibd_monitor_ece": ("ece", "Expected calibration error in the window (15 equal-width bins; top-label for multiclass)"),
    "calibd_monitor_brier": ("brier", "Brier score in the window"),
    "calibd_monitor_log_loss": ("log_loss", "Log-loss in the window"),
    "calibd_monitor_mean_prediction": ("mean_prediction", "Mean predicted probability in the window"),
    "calibd_monitor_positive_rate": ("positive_rate", "Observed positive rate in the window (binary)"),
    "calibd_monitor_acceptance_rate": ("acceptance_rate", "Share of inputs accepted (selective methods)"),
}


def monitor_snapshot(sessions: Sessions) -> list[dict]:
    """Window metrics and drift state of every calibrator's current version."""
    snapshot = []
    for name, (uid, version) in sorted(repository.current_versions(sessions).items()):
        if version is None:
            continue
        info = repository.get_version(sessions, name, version)
        answer = monitoring_service.monitor(sessions, info.calibrator_id, version, info.n_classes == 2, alpha=1.0)
        snapshot.append({"name": name, "version": version} | answer)
    return snapshot


class MonitorCollector:
    """Yields the monitor gauges from the database, rereading it at most every ``max_age`` seconds
    (several Prometheus servers, or a fast scrape interval, share one read)."""

    def __init__(self, sessions: Sessions, max_age: float = 2.0):
        self.sessions = sessions
        self.max_age = max_age
        self._snapshot: tuple[float, list[dict]] | None = None

    def _read(self) -> list[dict]:
        now = time.monotonic()
        if self._snapshot is None or now - self._snapshot[0] > self.max_age:
            self._snapshot = (now, monitor_snapshot(self.sessions))
        return self._snapshot[1]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._read()
        for metric, (key, help_text) in MONITOR_GAUGES.items():
            family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version", "window"])
            for entry in snapshot:
                for window, values in entry["windows"].items():
                    if values.get(key) is not None:
                        family.add_metric([entry["name"], str(entry["version"]), window], values[key])
            yield family
        evalue = GaugeMetricFamily("calibd_monitor_drift_log_evalue", "Log e-value of the drift test", labels=["calibrator", "version"])
        alarm = GaugeMetricFamily("calibd_monitor_drift_alarm", "1 once the drift test has alarmed (latched)", labels=["calibrator", "version"])
        for entry in snapshot:
            labels = [entry["name"], str(entry["version"])]
            evalue.add_metric(labels, entry["drift"]["log_evalue"])
            alarm.add_metric(labels, 1.0 if entry["drift"]["alarm"] else 0.0)
        yield evalue
        yield alarm
        yield from _segment_gauges(snapshot)
        yield from _label_timing_metrics(snapshot)


def _label_timing_metrics(snapshot: list[dict]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """calibd_label_*: what waits for maturity, what maturity counted, and the label delays (read from the
    database, so every replica reports the same; the counters only grow)."""
    gauges = {
        "calibd_label_backlog_predictions": ("waiting_predictions", "Logged predictions whose label window has not passed"),
        "calibd_label_backlog_labels": ("waiting_labels", "Labels stored, waiting for their prediction to mature"),
    }
    for metric, (key, help_text) in gauges.items():
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator"])
        for entry in snapshot:
            family.add_metric([entry["name"]], entry["labels"][key])
        yield family
    counters = {
        "calibd_late_labels": ("late_labels", "Labels that came after their prediction matured (left out)"),
        "calibd_implied_negatives": ("implied_negatives", "Predictions without a label at maturity, counted as negatives"),
        "calibd_unlabelled": ("unlabelled", "Predictions without a label at maturity, left out (missing: unlabelled)"),
    }
    for metric, (key, help_text) in counters.items():
        family = CounterMetricFamily(metric, help_text, labels=["calibrator"])
        for entry in snapshot:
            family.add_metric([entry["name"]], entry["labels"][key])
        yield family
    delay = GaugeMetricFamily(
        "calibd_label_delay_seconds", "Label delay (arrival minus prediction time) by label value, from a histogram",
        labels=["calibrator", "label", "quantile"],
    )
    for entry in snapshot:
        for label, values in entry["labels"]["delays"].items():
            for quantile, key in (("0.5", "p50_seconds"), ("0.9", "p90_seconds")):
                if values[key] is not None:
                    delay.add_metric([entry["name"], label, quantile], values[key])
    yield delay
    mismatch = GaugeMetricFamily(
        "calibd_label_delay_mismatch",
        "1 when labels are final on arrival but positives' and negatives' delays clearly differ (declare a label window)",
        labels=["calibrator"],
    )
    for entry in snapshot:
        mismatch.add_metric([entry["name"]], 1.0 if entry["labels"]["delay_mismatch"] else 0.0)
    yield mismatch


def _segment_gauges(snapshot: list[dict]) -> Iterator[GaugeMetricFamily]:
    """calibd_segment_*: the per-segment monitors of each current version (at most D (max_values + 1) each)."""
    windowed = {
        "calibd_segment_ece": ("ece", "Expected calibration error of the segment in the window (15 equal-width bins)"),
        "calibd_segment_samples": ("samples", "Labelled predictions of the segment in the window"),
    }
    for metric, (key, help_text) in windowed.items():
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version", "window", "dimension", "segment"])
        for entry in snapshot:
            for segment in entry["segments"]:
                for window, values in segment["windows"].items():
                    if values.get(key) is not None:
                        labels = [entry["name"], str(entry["version"]), window, segment["dimension"], segment["segment"]]
                        family.add_metric(labels, values[key])
        yield family
    labels = ["calibrator", "version", "dimension", "segment"]
    evalue = GaugeMetricFamily("calibd_segment_drift_log_evalue", "Log e-value of the segment's drift test", labels=labels)
    alarm = GaugeMetricFamily(
        "calibd_segment_drift_alarm",
        "1 once the segment's drift test has alarmed (latched; alpha split over the version's segments)",
        labels=labels,
    )
    for entry in snapshot:
        for segment in entry["segments"]:
            values = [entry["name"], str(entry["version"]), segment["dimension"], segment["segment"]]
            evalue.add_metric(values, segment["drift"]["log_evalue"])
            alarm.add_metric(values, 1.0 if segment["drift"]["alarm"] else 0.0)
    yield evalue
    yield alarm


def make_registry(sessions: Sessions) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_DefaultCollectors())
    registry.register(MonitorCollector(sessions))
    return registry


class _DefaultCollectors:
    """This process's own metrics (the default registry) inside another registry."""

    def collect(self):
        return REGISTRY.collect()


router = APIRouter(tags=["observability"])


@router.get(
    "/metrics",
    summary="Prometheus exposition (open unless CALIBD_METRICS_REQUIRE_KEY)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}, 401: {}, 403: {}, 503: {}},
)
async def metrics(request: Request) -> Response:
    app = services(request)
    if app.settings.metrics_require_key:
        await REQUIRE_READ.dependency(request, await bearer(request))
    registry = app.metrics_registry
    flush_request_metrics()  # this process's counts; other workers' are at most CALIBD_METRICS_FLUSH_SECONDS old
    return Response(await run_in_threadpool(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)


#: The per-request metrics, counted in plain numbers and added to the ones above in batches (pending_metrics).
PENDING_DURATIONS = PendingHistogram(REQUEST_DURATION)
PENDING_CALIBRATE_REQUESTS = PendingCounter(CALIBRATE_REQUESTS)
PENDING_CALIBRATE_SCORES = PendingCounter(CALIBRATE_SCORES)


def observe_duration(route: str, method: str, status: int, seconds: float) -> None:
    """Observe a request's duration in ``calibd_request_duration_seconds`` by route template, method and status."""
    PENDING_DURATIONS.observe((route, method, _STATUS.get(status) or str(status)), seconds)


def count_calibrated(calibrator: str, scores: int) -> None:
    """One request to calibrate ``scores`` scores with ``calibrator``: calibd_calibrate_{requests,scores}_total."""
    labels = (calibrator,)
    PENDING_CALIBRATE_REQUESTS.inc(labels)
    PENDING_CALIBRATE_SCORES.inc(labels, scores)


def flush_request_metrics() -> None:
    """Add the pending request metrics to the Prometheus metrics (the event loop calls it)."""
    PENDING_DURATIONS.flush()
    PENDING_CALIBRATE_REQUESTS.flush()
    PENDING_CALIBRATE_SCORES.flush()


_STATUS = {status: str(status) for status in range(100, 600)}
