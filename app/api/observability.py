"""Prometheus metrics: request counters and latencies, and the monitors' gauges.

Counters and histograms live in this process (prometheus-client's
multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set, as ``calibd serve
--workers N`` does). The monitor gauges are read from the database at scrape
time, so every replica and every worker reports the same values.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import multiprocess
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..services import monitors
from ..storage.repository import Sessions
from .auth import REQUIRE_READ, bearer
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
logger = logging.getLogger("calibd")

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


class MonitorCollector:
    """Yields the monitor gauges, read from the database at most once per ``max_age`` seconds for
    all scrapers together.

    A scrape that finds the values older than that starts one read (or joins the read in flight)
    and waits for it at most ``budget`` seconds; past that, or while the database is away, it gets
    the last values read, and ``calibd_monitor_values_age_seconds`` says how old they are. The
    read runs in a thread of its own, on an engine of its own (``read``), so scrapes neither hold
    request threads nor take connections from the routes that write.
    """

    def __init__(self, read: Callable[[], list[dict]], max_age: float = 2.0, budget: float = 5.0):
        self.read = read
        self.max_age = max_age
        self.budget = budget
        self._lock = threading.Lock()
        self._exposition = b""  # the monitor gauges of the last read, rendered once for every scrape
        self._read_at: float | None = None  # the last read that succeeded
        self._tried_at: float | None = None  # the last read that ended, failed or not
        self._in_flight: Future | None = None

    def refresh(self) -> Future | None:
        """The read that brings fresh values (started here unless one is in flight), or None when
        the values are fresh, or the last read failed within ``max_age`` (the database away: no
        scrape waits for it)."""
        with self._lock:
            if self._tried_at is not None and time.monotonic() - self._tried_at <= self.max_age:
                return None
            if self._in_flight is None:
                self._in_flight = Future()
                threading.Thread(target=self._run, args=(self._in_flight,), name="calibd-monitor-read", daemon=True).start()
            return self._in_flight

    async def wait_fresh(self) -> None:
        """Wait, at most ``budget`` seconds, for values no older than ``max_age``."""
        pending = self.refresh()
        if pending is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending)), self.budget)
            except TimeoutError:
                logger.warning("monitor read still running after %.1f s; /metrics serves the last values", self.budget)

    def _run(self, done: Future) -> None:
        try:
            exposition = _render(list(monitor_families(self.read())))
        except Exception as error:  # the database away: keep the last values
            logger.warning("monitor read failed; /metrics serves the last values: %s", error)
            with self._lock:
                self._tried_at, self._in_flight = time.monotonic(), None
            done.set_result(False)
            return
        with self._lock:
            self._exposition, self._in_flight = exposition, None
            self._read_at = self._tried_at = time.monotonic()
        done.set_result(True)

    def exposition(self) -> bytes:
        """The monitor gauges of the last read, in the text format."""
        with self._lock:
            return self._exposition

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """How old the monitor values are (the gauges themselves come from ``exposition``)."""
        self.refresh()  # never waits here: the route waited already
        with self._lock:
            read_at = self._read_at
        age = GaugeMetricFamily(
            "calibd_monitor_values_age_seconds",
            "Seconds since the monitor gauges were read from the database (grows while it is away)",
        )
        if read_at is not None:
            age.add_metric([], time.monotonic() - read_at)
        yield age


class _Families:
    """Metric families read once, as a collector."""

    def __init__(self, families: list[GaugeMetricFamily]):
        self.families = families

    def collect(self) -> list[GaugeMetricFamily]:
        return self.families


def _render(families: list[GaugeMetricFamily]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def monitor_families(snapshot: list[dict]) -> Iterator[GaugeMetricFamily]:
    """The calibd_monitor_* and calibd_segment_* gauges of every current version."""
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


def make_registry(monitor_sessions: Sessions, budget: float) -> tuple[CollectorRegistry, MonitorCollector]:
    """This process's /metrics registry, and its monitor collector, which reads through
    ``monitor_sessions`` (an engine of its own, see ``db.make_side_engine``)."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_DefaultCollectors())
    collector = MonitorCollector(lambda: monitors.current_monitors(monitor_sessions), budget=budget)
    registry.register(collector)
    return registry, collector


class _DefaultCollectors:
    """This process's own metrics (the default registry) inside another registry."""

    def collect(self):
        return REGISTRY.collect()


router = APIRouter(tags=["observability"])


@router.get(
    "/metrics",
    summary="Prometheus exposition (open unless CALIBD_METRICS_REQUIRE_KEY)",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}, 401: {}, 403: {}},
)
async def metrics(request: Request) -> Response:
    app = services(request)
    if app.settings.metrics_require_key:
        await REQUIRE_READ.dependency(request, await bearer(request))
    collector = app.monitor_collector
    await collector.wait_fresh()
    text = await run_in_threadpool(generate_latest, app.metrics_registry)
    return Response(text + collector.exposition(), media_type=CONTENT_TYPE_LATEST)


def observe_duration(route: str, method: str, status: int, seconds: float) -> None:
    """Observe a request's duration in ``calibd_request_duration_seconds`` by route template, method and status."""
    key = (route, method, status)
    observe = _duration_children.get(key)
    if observe is None:
        observe = _duration_children[key] = _observer(REQUEST_DURATION.labels(route, method, str(status)))
    observe(seconds)


def _observer(child: Histogram):
    """``child.observe``, a third of its time: the bucket found by bisection instead of a loop over
    the bounds (the histogram has no exemplars to keep). Buckets hold non-cumulative counts, so
    one bucket and the sum change, as ``observe`` changes them."""
    bounds = list(child._upper_bounds)
    increments = [bucket.inc for bucket in child._buckets]
    add_sum = child._sum.inc

    def observe(seconds: float) -> None:
        add_sum(seconds)
        increments[bisect_left(bounds, seconds)](1)

    return observe


#: The histogram's observers by (route, method, status): ``labels()`` takes a lock and
#: builds its key on every call. Bounded by the app's routes times the statuses it answers.
_duration_children: dict[tuple[str, str, int], Callable[[float], None]] = {}
