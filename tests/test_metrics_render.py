"""/metrics writes the monitor gauges line by line (prometheus-client's families cost too much at
thousands of calibrators): the text must be what prometheus-client writes for the same families,
label escaping, sorted label names, NaN left out and Go's number format included."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from calibd.api.monitor_exposition import (
    DELAY_HELP, LABEL_COUNTERS, LABEL_GAUGES, MISMATCH_HELP, MONITOR_GAUGES, SEGMENT_ALARM_HELP, SEGMENT_GAUGES, render,
)
from calibd.monitoring.windows import METRICS, WINDOWS
from calibd.services.monitoring import CurrentMonitors


def _current() -> CurrentMonitors:
    rng = np.random.default_rng(3)
    names = ["plain", 'quo"te', "back\\slash", "new\nline", "ünï"]
    n = len(names)

    def metrics(rows: int) -> dict[str, np.ndarray]:
        out = {m: rng.uniform(size=rows) for m in METRICS}
        out["samples"] = np.array([0.0, 12.0, 1.5e7, 3.0, 7.0][:rows])
        out["ece"][0] = np.nan  # an empty window: left out
        out["positive_rate"][rows - 1] = np.nan
        out["brier"][1 % rows] = 2.5e6  # Go's exponent format from a million up
        return out

    segments = [(0, "country", "fr"), (1, "country", "__OTHER"), (3, 'di"m', "a\\b\nc")]
    labels = [
        {"waiting_predictions": i, "waiting_labels": 2 * i, "late_labels": i, "implied_negatives": 0, "unlabelled": 3,
         "delay_mismatch": i == 2,
         "delays": {} if i % 2 else {"0": {"p50_seconds": 1.5, "p90_seconds": None}, "1": {"p50_seconds": 2.0, "p90_seconds": 4e6}}}
        for i in range(n)
    ]
    return CurrentMonitors(
        names=names, versions=[1, 2, 3, 1, 10], windows={w: metrics(n) for w in WINDOWS},
        drift_alarm=np.array([False, True, False, False, True]), drift_log_evalue=np.array([0.0, 3.5, -1.25, math.inf, 1e-7]),
        segments=segments, segment_windows={w: metrics(len(segments)) for w in WINDOWS},
        segment_alarm=np.array([True, False, False]), segment_log_evalue=np.array([0.5, 0.25, 9.0]), labels=labels,
    )


def _reference(current: CurrentMonitors) -> bytes:
    """The same families through prometheus-client."""
    families = []
    for metric, (key, help_text) in MONITOR_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version", "window"])
        for window, values in current.windows.items():
            for i, value in enumerate(values[key]):
                if not np.isnan(value):
                    family.add_metric([current.names[i], str(current.versions[i]), window], float(value))
        families.append(family)
    for metric, help_text, values in (
        ("calibd_monitor_drift_log_evalue", "Log e-value of the drift test", current.drift_log_evalue),
        ("calibd_monitor_drift_alarm", "1 once the drift test has alarmed (latched)", current.drift_alarm.astype(float)),
    ):
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version"])
        for i, value in enumerate(values):
            family.add_metric([current.names[i], str(current.versions[i])], float(value))
        families.append(family)
    for metric, (key, help_text) in SEGMENT_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version", "window", "dimension", "segment"])
        for window, values in current.segment_windows.items():
            for (row, dimension, segment), value in zip(current.segments, values[key]):
                if not np.isnan(value):
                    family.add_metric([current.names[row], str(current.versions[row]), window, dimension, segment], float(value))
        families.append(family)
    for metric, help_text, values in (
        ("calibd_segment_drift_log_evalue", "Log e-value of the segment's drift test", current.segment_log_evalue),
        ("calibd_segment_drift_alarm", SEGMENT_ALARM_HELP, current.segment_alarm.astype(float)),
    ):
        family = GaugeMetricFamily(metric, help_text, labels=["calibrator", "version", "dimension", "segment"])
        for (row, dimension, segment), value in zip(current.segments, values):
            family.add_metric([current.names[row], str(current.versions[row]), dimension, segment], float(value))
        families.append(family)
    for kind, table in ((GaugeMetricFamily, LABEL_GAUGES), (CounterMetricFamily, LABEL_COUNTERS)):
        for metric, (key, help_text) in table.items():
            family = kind(metric, help_text, labels=["calibrator"])
            for name, timing in zip(current.names, current.labels):
                family.add_metric([name], timing[key])
            families.append(family)
    delay = GaugeMetricFamily("calibd_label_delay_seconds", DELAY_HELP, labels=["calibrator", "label", "quantile"])
    mismatch = GaugeMetricFamily("calibd_label_delay_mismatch", MISMATCH_HELP, labels=["calibrator"])
    for name, timing in zip(current.names, current.labels):
        for label, values in timing["delays"].items():
            for quantile, key in (("0.5", "p50_seconds"), ("0.9", "p90_seconds")):
                if values[key] is not None:
                    delay.add_metric([name, label, quantile], values[key])
        mismatch.add_metric([name], 1.0 if timing["delay_mismatch"] else 0.0)
    families += [delay, mismatch]

    class Families:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return generate_latest(registry)


def test_render_writes_what_prometheus_client_writes():
    current = _current()
    text = render(current)
    assert text == _reference(current)
    # And Prometheus's own parser reads it back: every calibrator's label as it was given.
    parsed = {family.name: family for family in text_string_to_metric_families(text.decode())}
    names = {sample.labels["calibrator"] for sample in parsed["calibd_monitor_drift_alarm"].samples}
    assert names == set(current.names)
    assert {s.labels["segment"] for s in parsed["calibd_segment_drift_alarm"].samples} == {"fr", "__OTHER", "a\\b\nc"}


def test_render_of_no_calibrators_has_the_headers_only():
    empty = CurrentMonitors(
        names=[], versions=[], windows={w: {m: np.zeros(0) for m in METRICS} for w in WINDOWS},
        drift_alarm=np.zeros(0, dtype=bool), drift_log_evalue=np.zeros(0), segments=[],
        segment_windows={w: {m: np.zeros(0) for m in METRICS} for w in WINDOWS},
        segment_alarm=np.zeros(0, dtype=bool), segment_log_evalue=np.zeros(0), labels=[],
    )
    text = render(empty)
    assert text == _reference(empty)
    assert all(line.startswith("#") for line in text.decode().splitlines())


def test_gzip_after_is_one_gzip_member_of_both_parts():
    import gzip
    import zlib

    from calibd.api.monitor_exposition import deflate, gzip_after

    rng = np.random.default_rng(5)
    for head, tail in (
        (b"", b""), (b"", b"# counters\n"), (b"x" * 100_000, b""),
        (render(_current()) * 50, b"calibd_x 1.0\n" * 3_000),
        (rng.bytes(130_000), rng.bytes(70_000)),  # incompressible: stored blocks on both sides
    ):
        body = gzip_after(deflate(head), tail)
        assert gzip.decompress(body) == head + tail
        one = zlib.decompressobj(zlib.MAX_WBITS | 16)  # what httpx does: a single member, nothing left over
        assert one.decompress(body) == head + tail and one.eof and one.unused_data == b""
