"""The consumer's Prometheus metrics: messages, rows, errors and the consumer group's lag."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class StreamMetrics:
    messages: Counter
    acked: Counter
    rows: Counter
    errors: Counter
    lag: Gauge
    pending: Gauge

    @staticmethod
    def make(registry: CollectorRegistry) -> StreamMetrics:
        return StreamMetrics(
            messages=Counter("calibd_stream_messages_total", "Stream messages read", ["stream"], registry=registry),
            acked=Counter("calibd_stream_messages_acked_total", "Stream messages recorded and acknowledged", ["stream"],
                          registry=registry),
            rows=Counter("calibd_stream_rows_total", "Labels recorded from stream messages", ["stream"], registry=registry),
            errors=Counter("calibd_stream_errors_total",
                           "Stream errors: dead_letter (a message moved to the dead-letter stream) or transient "
                           "(calibd could not record now; retried)", ["stream", "kind"], registry=registry),
            lag=Gauge("calibd_stream_lag", "Entries of the stream not yet delivered to the consumer group (XINFO GROUPS lag)",
                      ["stream", "group"], registry=registry),
            pending=Gauge("calibd_stream_pending", "Entries delivered to the group and not yet acknowledged",
                          ["stream", "group"], registry=registry),
        )

    @staticmethod
    @cache
    def default() -> StreamMetrics:
        return StreamMetrics.make(REGISTRY)
