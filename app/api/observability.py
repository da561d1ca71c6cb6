"""Prometheus metrics: request counters and latencies, and the monitors' gauges.

Counters and histograms live in this process (prometheus-client's
multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set, as ``calibd serve
--workers N`` does); the per-request ones are counted in plain numbers first
and added in batches (``pending_metrics``). The monitor gauges are read from the database, at most
once every 2 s for all scrapers together (``MonitorCollector``), so every replica and every worker
reports the same values.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import multiprocess
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .monitor_exposition import Deflated, deflate, gzip_after
from .auth import REQUIRE_READ, bearer
from .pending_metrics import PendingCounters, PendingHistogram
from .state import services_of

CALIBRATE_REQUESTS = Counter("calibd_calibrate_requests_total", "Calibrate requests served", ["calibrator"])
CALIBRATE_SCORES = Counter("calibd_calibrate_scores_total", "Scores calibrated", ["calibrator"])
FEEDBACK = Counter("calibd_feedback_total", "Labelled predictions recorded", ["calibrator"])
FEEDBACK_DUPLICATES = Counter(
    "calibd_feedback_duplicates_total", "Labels not recorded: their prediction id was labelled before", ["calibrator"]
)
FEEDBACK_UNMATCHED = Counter(
    "calibd_feedback_unmatched_total", "Labels whose prediction was not logged within the grace period", ["calibrator"]
)
REQUEST_DURATION = Histogram(
    "calibd_request_duration_seconds", "HTTP request latency", ["route", "method", "status"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PREDICTION_LOG_DROPPED = Counter(
    "calibd_prediction_log_dropped_total", "Logged predictions dropped (database away or queue full)", ["calibrator"]
)
logger = logging.getLogger("calibd")


class MonitorCollector:
    """The monitor gauges, read from the database at most once per ``max_age`` seconds for all
    scrapers together, and rendered once per read.

    A scrape that finds the values older than that starts one read (or joins the one in flight) and
    waits for it until ``budget`` seconds after it began; past that, or while the database is away,
    it gets the last values read, and ``calibd_monitor_values_age_seconds`` says how old they are.
    After a failed read, scrapes start the next one without waiting for it. A thread of its own
    waits for the read, which ``read`` does in a process of its own on an engine of its own
    (``monitor_exposition``), so scrapes neither hold request threads, nor take connections from
    the routes that write, nor the serving process's GIL.
    """

    def __init__(self, read: Callable[[], tuple[bytes, Deflated]], max_age: float = 2.0, budget: float = 5.0):
        self.read = read
        self.max_age = max_age
        self.budget = budget
        self._lock = threading.Lock()
        self._exposition = b""  # the monitor gauges of the last good read, in the text format
        self._deflated = deflate(b"")  # the same, deflated once for every gzip scrape
        self._read_at: float | None = None  # when the last good read ended
        self._tried_at: float | None = None  # when the last read ended, good or not
        self._failed = False
        self._in_flight: tuple[Future, float] | None = None  # the read running, and when it began
        self._reads = 0  # good reads so far
        self._bodies: tuple[asyncio.Future, int] | None = None  # the scrape body being made, and of which read

    def refresh(self) -> tuple[Future, float] | None:
        """The read to wait for, and when it began (started here unless one is in flight), or None
        when the values are fresh, or when the last read failed (the database away: no scrape waits)."""
        with self._lock:
            if self._tried_at is not None and time.monotonic() - self._tried_at <= self.max_age:
                return None
            if self._in_flight is None:
                self._in_flight = (Future(), time.monotonic())
                threading.Thread(
                    target=self._run, args=(self._in_flight[0],), name="calibd-monitor-read", daemon=True
                ).start()
            return None if self._failed else self._in_flight

    async def wait_fresh(self) -> None:
        """Wait for values no older than ``max_age``, at most until ``budget`` seconds after the read began."""
        pending = self.refresh()
        if pending is None:
            return
        future, began = pending
        left = self.budget - (time.monotonic() - began)
        if left <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), left)
        except TimeoutError:
            logger.warning("monitor read still running after %.1f s; /metrics serves the last values", self.budget)

    def _run(self, done: Future) -> None:
        try:
            exposition, deflated = self.read()
        except Exception as error:  # the database away: keep the last values
            logger.warning("monitor read failed; /metrics serves the last values: %s", error)
            with self._lock:
                self._tried_at, self._in_flight, self._failed = time.monotonic(), None, True
            done.set_result(False)
            return
        with self._lock:
            self._exposition, self._deflated, self._in_flight, self._failed = exposition, deflated, None, False
            self._read_at = self._tried_at = time.monotonic()
            self._reads += 1
        done.set_result(True)

    def exposition_deflated(self) -> tuple[bytes, Deflated]:
        """``exposition()``, and the same deflated (for ``gzip_after``), of one read."""
        with self._lock:
            return self._exposition, self._deflated

    async def bodies(self, registry: CollectorRegistry) -> tuple[bytes, bytes]:
        """A scrape's body, plain and gzipped: the monitor gauges of the last read, then ``registry``'s
        (this process's counters and ``collect``). Scrapes that arrive while one is made from the
        latest read share it; one that waited for a newer read than a body in the making gets its own."""
        with self._lock:
            reads = self._reads
        if self._bodies is None or self._bodies[0].done() or self._bodies[1] != reads:
            self._bodies = (asyncio.ensure_future(run_in_threadpool(self._make_bodies, registry)), reads)
        return await asyncio.shield(self._bodies[0])

    def _make_bodies(self, registry: CollectorRegistry) -> tuple[bytes, bytes]:
        text = generate_latest(registry)
        monitors, deflated = self.exposition_deflated()
        # The monitor gauges (megabytes at thousands of calibrators) were deflated once, by the read.
        return monitors + text, gzip_after(deflated, text)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """How old the monitor values are (the gauges themselves come from ``exposition_deflated``)."""
        with self._lock:
            read_at = self._read_at
        age = GaugeMetricFamily(
            "calibd_monitor_values_age_seconds",
            "Seconds since the monitor gauges were read from the database (grows while it is away)",
        )
        if read_at is not None:
            age.add_metric([], time.monotonic() - read_at)
        yield age


def make_registry(read: Callable[[], tuple[bytes, Deflated]], budget: float) -> tuple[CollectorRegistry, MonitorCollector]:
    """This process's /metrics registry, and its monitor collector, which gets the monitor gauges
    from ``read`` (``monitor_exposition``: their text, and the same deflated)."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_DefaultCollectors())
    collector = MonitorCollector(read, budget=budget)
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
    services = services_of(request)
    if services.settings.metrics_require_key:
        await REQUIRE_READ.dependency(request, await bearer(request))
    collector = services.monitor_collector
    await collector.wait_fresh()  # one shared read, within CALIBD_METRICS_TIMEOUT_SECONDS; else the last values
    flush_request_metrics()  # this process's counts; other workers' are at most CALIBD_METRICS_FLUSH_SECONDS old
    plain, gzipped = await collector.bodies(services.metrics_registry)
    if "gzip" in request.headers.get("accept-encoding", "").lower():
        return Response(gzipped, media_type=CONTENT_TYPE_LATEST, headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
    return Response(plain, media_type=CONTENT_TYPE_LATEST, headers={"Vary": "Accept-Encoding"})




#: The per-request metrics, counted in plain numbers and added to the ones above in batches (pending_metrics).
PENDING_DURATIONS = PendingHistogram(REQUEST_DURATION)
#: calibd_calibrate_requests_total and calibd_calibrate_scores_total, counted together.
PENDING_CALIBRATED = PendingCounters(CALIBRATE_REQUESTS, CALIBRATE_SCORES)


def observe_duration(route: str, method: str, status: int, seconds: float) -> None:
    """Observe a request's duration in ``calibd_request_duration_seconds`` by route template, method and status."""
    PENDING_DURATIONS.observe((route, method, _STATUS.get(status) or str(status)), seconds)


def count_calibrated(calibrator: str, scores: int) -> None:
    """One request to calibrate ``scores`` scores with ``calibrator``: calibd_calibrate_{requests,scores}_total."""
    PENDING_CALIBRATED.inc((calibrator,), 1, scores)


def flush_request_metrics() -> None:
    """Add the pending request metrics to the Prometheus metrics (the event loop calls it)."""
    PENDING_DURATIONS.flush()
    PENDING_CALIBRATED.flush()


_STATUS = {status: str(status) for status in range(100, 600)}
