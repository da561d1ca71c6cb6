"""The monitor gauges of every calibrator's current version, as /metrics serves them: read from the
database and written in the Prometheus text format (and deflated once) in a process of their own,
so that the read's Python, tens of thousands of rows and samples at thousands of calibrators,
never holds the serving process's GIL (a thread would delay every request while it runs)."""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from ..services import monitoring as monitoring_service
from ..services.monitoring import CurrentMonitors
from ..storage.db import make_sessionmaker, make_side_engine, process_sessions
from ..storage.repository import Sessions
from ..workers.pool import init_side_process
from ..workers.side_process import SideProcess, shares_database

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


def read_exposition(url: str, timeout: float) -> tuple[bytes, Deflated]:
    """Every current version's monitor gauges, read through the reader process's own engine
    (``timeout`` on its connect, pool wait and statements), in the text format and as a raw deflate stream."""
    return exposition_of(process_sessions(url, timeout))


def exposition_of(sessions: Sessions) -> tuple[bytes, Deflated]:
    text = render(monitoring_service.current_monitors(sessions))
    return text, deflate(text)


def reader(url: str, timeout: float, sessions: Sessions) -> ProcessReader | ThreadReader:
    """How this app reads the monitor gauges: in a process of its own, but for an in-memory SQLite
    database, which only this process's own engine (``sessions``) sees."""
    return ProcessReader(url, timeout) if shares_database(url) else ThreadReader(sessions)


class ThreadReader:
    """Reads the monitor gauges in the calling thread, through the app's own sessions."""

    def __init__(self, sessions: Sessions):
        self.sessions = sessions

    def __call__(self) -> tuple[bytes, Deflated]:
        return exposition_of(self.sessions)

    def close(self) -> None:
        pass


class ProcessReader:
    """Calls ``read_exposition`` in a side process, started at the first read. Until that process is
    up (a second or two of imports), reads run here, on an engine of their own: the first scrapes
    after a start have the monitor gauges too."""

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.timeout = timeout
        self.process = SideProcess(__name__, init_side_process)
        self._local: Sessions | None = None

    def __call__(self) -> tuple[bytes, Deflated]:
        if not self.process.started():
            if self._local is None:
                self._local = make_sessionmaker(make_side_engine(self.url, self.timeout))
            return exposition_of(self._local)
        if self._local is not None:  # the process is up: this engine's connection is not needed again
            self._local.kw["bind"].dispose()
            self._local = None
        return self.process.call(read_exposition, self.url, self.timeout)

    def close(self) -> None:
        self.process.close()  # a read waiting for a silent database is not waited for
        if self._local is not None:
            self._local.kw["bind"].dispose()


def render(current: CurrentMonitors) -> bytes:
    """The calibd_monitor_*, calibd_segment_* and calibd_label_* families of every current version
    in the Prometheus text format, as prometheus-client writes them (label names sorted), but
    written here line by line: prometheus-client's families cost tens of microseconds a sample,
    and 2,000 calibrators have some 50,000 samples."""
    out: list[str] = []
    calibrators = [_label(name) for name in current.names]
    versions = [str(version) for version in current.versions]
    for metric, (key, help_text) in MONITOR_GAUGES.items():
        _header(out, metric, help_text, "gauge")
        for window, metrics in current.windows.items():
            for i, value in enumerate(metrics[key].tolist()):
                if value == value:  # not NaN (null in the monitor route)
                    out.append(f'{metric}{{calibrator="{calibrators[i]}",version="{versions[i]}",window="{window}"}} {_go(value)}\n')
    for metric, help_text, values in (
        ("calibd_monitor_drift_log_evalue", "Log e-value of the drift test", current.drift_log_evalue.tolist()),
        ("calibd_monitor_drift_alarm", "1 once the drift test has alarmed (latched)", current.drift_alarm.astype(float).tolist()),
    ):
        _header(out, metric, help_text, "gauge")
        out.extend(f'{metric}{{calibrator="{c}",version="{v}"}} {_go(x)}\n' for c, v, x in zip(calibrators, versions, values))
    segments = [
        f'calibrator="{calibrators[row]}",dimension="{_label(dimension)}",segment="{_label(segment)}",version="{versions[row]}"'
        for row, dimension, segment in current.segments
    ]
    for metric, (key, help_text) in SEGMENT_GAUGES.items():
        _header(out, metric, help_text, "gauge")
        for window, metrics in current.segment_windows.items():
            for labels, value in zip(segments, metrics[key].tolist()):
                if value == value:
                    out.append(f'{metric}{{{labels},window="{window}"}} {_go(value)}\n')
    for metric, help_text, values in (
        ("calibd_segment_drift_log_evalue", "Log e-value of the segment's drift test", current.segment_log_evalue.tolist()),
        ("calibd_segment_drift_alarm", SEGMENT_ALARM_HELP, current.segment_alarm.astype(float).tolist()),
    ):
        _header(out, metric, help_text, "gauge")
        out.extend(f"{metric}{{{labels}}} {_go(x)}\n" for labels, x in zip(segments, values))
    _label_timing_lines(out, calibrators, current.labels)
    return "".join(out).encode()


#: calibd_segment_* gauges by window: name -> (the window metric, help text).
SEGMENT_GAUGES = {
    "calibd_segment_ece": ("ece", "Expected calibration error of the segment in the window (15 equal-width bins)"),
    "calibd_segment_samples": ("samples", "Labelled predictions of the segment in the window"),
}
SEGMENT_ALARM_HELP = "1 once the segment's drift test has alarmed (latched; alpha split over the version's segments)"
#: calibd_label_* gauges and counters: name -> (the label timing's key, help text).
LABEL_GAUGES = {
    "calibd_label_backlog_predictions": ("waiting_predictions", "Logged predictions whose label window has not passed"),
    "calibd_label_backlog_labels": ("waiting_labels", "Labels stored, waiting for their prediction to mature"),
}
LABEL_COUNTERS = {
    "calibd_late_labels": ("late_labels", "Labels that came after their prediction matured (left out)"),
    "calibd_implied_negatives": ("implied_negatives", "Predictions without a label at maturity, counted as negatives"),
    "calibd_unlabelled": ("unlabelled", "Predictions without a label at maturity, left out (missing: unlabelled)"),
}
DELAY_HELP = "Label delay (arrival minus prediction time) by label value, from a histogram"
MISMATCH_HELP = (
    "1 when labels are final on arrival but positives' and negatives' delays clearly differ (declare a label window)"
)


def _label_timing_lines(out: list[str], calibrators: list[str], labels: list[dict]) -> None:
    """calibd_label_*: what waits for maturity, what maturity counted, and the label delays (read from the
    database, so every replica reports the same; the counters only grow)."""
    for metric, (key, help_text) in LABEL_GAUGES.items():
        _header(out, metric, help_text, "gauge")
        out.extend(f'{metric}{{calibrator="{c}"}} {_go(float(t[key]))}\n' for c, t in zip(calibrators, labels))
    for metric, (key, help_text) in LABEL_COUNTERS.items():
        _header(out, metric + "_total", help_text, "counter")
        out.extend(f'{metric}_total{{calibrator="{c}"}} {_go(float(t[key]))}\n' for c, t in zip(calibrators, labels))
    metric = "calibd_label_delay_seconds"
    _header(out, metric, DELAY_HELP, "gauge")
    for c, timing in zip(calibrators, labels):
        for label, values in timing["delays"].items():
            for quantile, key in (("0.5", "p50_seconds"), ("0.9", "p90_seconds")):
                if values[key] is not None:
                    line = f'{metric}{{calibrator="{c}",label="{_label(label)}",quantile="{quantile}"}} {_go(float(values[key]))}\n'
                    out.append(line)
    metric = "calibd_label_delay_mismatch"
    _header(out, metric, MISMATCH_HELP, "gauge")
    out.extend(f'{metric}{{calibrator="{c}"}} {1.0 if t["delay_mismatch"] else 0.0}\n' for c, t in zip(calibrators, labels))


def _header(out: list[str], metric: str, help_text: str, kind: str) -> None:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {metric} {escaped}\n# TYPE {metric} {kind}\n")


def _label(value: str) -> str:
    """A label value escaped for the text format."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _go(value: float) -> str:
    """A sample value as prometheus-client writes it (Go's formatting): repr, but for infinities,
    NaN and values from a million up."""
    if -math.inf < value < 1e6:
        return repr(value)
    return floatToGoString(value)


@dataclass(frozen=True)
class Deflated:
    """A text deflated up to a full flush (byte-aligned, not final, no back-references past it), with
    its CRC-32 and length: the start of a gzip member that ``gzip_after`` ends with more text."""

    data: bytes
    crc: int
    size: int


def deflate(text: bytes) -> Deflated:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return Deflated(compressor.compress(text) + compressor.flush(zlib.Z_FULL_FLUSH), zlib.crc32(text), len(text))


def gzip_after(start: Deflated, tail: bytes) -> bytes:
    """One gzip member of ``start``'s text then ``tail``: the deflate blocks of ``tail`` continue
    ``start``'s stream (as pigz joins its chunks), so a scrape compresses only its own small part."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    end = compressor.compress(tail) + compressor.flush(zlib.Z_FINISH)
    trailer = struct.pack("<II", zlib.crc32(tail, start.crc), (start.size + len(tail)) & 0xFFFFFFFF)
    return GZIP_HEADER + start.data + end + trailer


#: A gzip member's header: deflate, no flags, no time, no extra flags, unknown OS.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
