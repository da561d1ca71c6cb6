"""Structured logs: JSON lines, each with the request id of the request it belongs to.

A request's id is its X-Request-ID header when it sends a sane one, else a
new random id; the response echoes it. Every log line written while the
request is handled carries it, and one access line per request records the
route, status and duration.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import json
import logging
import math
import os
import random
import re
import sys
import threading
import time
import weakref
from datetime import datetime, timezone

import orjson


request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_ACCEPTED_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
access_logger = logging.getLogger("calibd.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and any extra fields."""

    STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": _utc_milliseconds(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        standard = self.STANDARD
        line.update({k: v for k, v in vars(record).items() if k not in standard})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # orjson for lines of plain values (every access line): a tenth of json.dumps's
        # time. Anything else, json.dumps with str() for what JSON cannot hold, as always.
        for value in line.values():
            kind = type(value)
            if kind not in _PLAIN and not (kind is float and math.isfinite(value)):
                return json.dumps(line, default=str)
        try:
            return orjson.dumps(line).decode()
        except orjson.JSONEncodeError:  # an int beyond 64 bits
            return json.dumps(line, default=str)


_PLAIN = frozenset({str, int, bool, type(None)})
_second: tuple[int, str] = (-1, "")


def _utc_milliseconds(created: float) -> str:
    """``datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds")``, a third
    of the time: the date and time of day are formatted once a second. Rounds to the microsecond
    half-even, as datetime does, before truncating to the millisecond."""
    global _second
    seconds = math.floor(created)
    micro = round((created - seconds) * 1e6)
    if micro >= 1_000_000:
        seconds, micro = seconds + 1, micro - 1_000_000
    cached_second, prefix = _second
    if cached_second != seconds:
        prefix = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (seconds, prefix)
    return f"{prefix}.{micro // 1000:03d}+00:00"


#: How often the log writer wakes to write what is queued (lines reach stderr at most about this much later).
_LINGER_SECONDS = 0.25


class BackgroundStreamHandler(logging.StreamHandler):
    """A StreamHandler that formats in the caller's thread and writes from a thread of its own.

    A record is formatted where it is logged (the request id is read there),
    then queued; an access line is queued as its fields (``access_line``) and
    formatted by the writer; a writer thread writes whatever is queued in one
    write. The event loop never waits on stderr: a log collector that falls
    behind, a full pipe or a file whose page is being written back stalled
    /calibrate for 15-40 ms at a time before, the longest waits of its tail
    latency.

    The writer wakes every quarter second, not once a request. A thread that
    wakes needs the GIL, and in CPython 3.11, while it waits for it, every GIL
    release of the event loop's thread (numpy's ufuncs release it above 500
    numbers; interp, take and searchsorted at any size) wakes it in turn, at
    10-20 us a time (benchmarks/calibrate_profile.py measures it); under
    full load the loop's thread almost always takes the GIL back first, so one
    wake-up can cost tens of milliseconds of such releases; waking every 20 ms,
    it would cost them most of the time. Both sides take no lock per line: the
    queue is a deque, whose append and popleft are atomic. Lines keep their
    order; at most ``capacity`` wait (beyond that the caller writes them, as it
    always did); ``flush()``, which logging calls at exit, writes what is queued.
    """

    def __init__(self, stream=None, capacity: int = 10_000):
        super().__init__(stream)
        #: Formatted lines, and access entries (tuples) that the writer formats.
        self._lines: collections.deque[str | tuple] = collections.deque()
        self._capacity = capacity
        self._write_lock = threading.Lock()  # one batch at a time, in order
        self._writer_started = False
        os.register_at_fork(after_in_child=functools.partial(_forget_writer_after_fork, weakref.ref(self)))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        self._queue(line)

    def queue_access(self, entry: tuple) -> None:
        """Queue an access line's fields (``access_line``); the writer formats them."""
        self._queue(entry)

    def _queue(self, item: str | tuple) -> None:
        if not self._writer_started:  # first use, or first in a forked child
            self._start_writer()
        self._lines.append(item)
        if len(self._lines) >= self._capacity:
            self._write_queued()

    def _start_writer(self) -> None:
        with self._write_lock:
            if not self._writer_started:
                threading.Thread(target=self._write_forever, name="log-writer", daemon=True).start()
                self._writer_started = True

    def _forget_writer(self) -> None:
        """In a forked child: no writer thread survived the fork, the queue copied from the
        parent is the parent's to write, and the lock may have been copied held."""
        self._lines.clear()
        self._write_lock = threading.Lock()
        self._writer_started = False

    def _write_forever(self) -> None:
        while True:  # idle, it wakes to an empty queue four times a second
            time.sleep(_LINGER_SECONDS)
            self._write_queued()

    def _write_queued(self) -> None:
        with self._write_lock:
            batch = [self._lines.popleft() for _ in range(len(self._lines))]
            if not batch:
                return
            terminator = self.terminator
            text = "".join(item if type(item) is str else format_access(item) + terminator for item in batch)
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:  # stderr closed: nothing to report to
                pass

    def flush(self) -> None:
        """Write what is queued, then flush the stream."""
        self._write_queued()
        super().flush()


def _forget_writer_after_fork(handler: weakref.ref[BackgroundStreamHandler]) -> None:
    live = handler()
    if live is not None:
        live._forget_writer()


_handlers: dict[int, BackgroundStreamHandler] = {}


def flush_logs() -> None:
    """Write every line still queued. uvicorn ends a process stopped by SIGTERM by raising
    the signal again, which skips ``logging.shutdown``; shutdown paths call this first."""
    for handler in list(_handlers.values()):
        handler.flush()


def configure_logging(level: str = "INFO") -> None:
    """Send calibd's and uvicorn's logs to stderr as JSON lines (written by a background thread)."""
    # One handler, and one writer thread, per stream: apps created again in the same process reuse it.
    handler = _handlers.get(id(sys.stderr))
    if handler is None or handler.stream is not sys.stderr:
        handler = _handlers[id(sys.stderr)] = BackgroundStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("calibd", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False
    # calibd writes its own access lines, with the request id.
    logging.getLogger("uvicorn.access").disabled = True


def new_request_id() -> str:
    """A version 4 UUID's hex (RFC 4122 variant), as ``uuid.uuid4().hex`` gives, from ``random``'s
    generator (seeded from the system's, and again in a forked child): a request id names a
    request in the logs, it guards nothing, and ``os.urandom`` was a system call a request."""
    return f"{_random_bits(128) & _UUID4_KEEP | _UUID4_SET:032x}"


#: The bits of a version 4 UUID that are not random: version 4 (bits 76-79), variant 10 (bits 62-63).
_UUID4_KEEP = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)
_UUID4_SET = (4 << 76) | (0x2 << 62)


_random_bits = random.getrandbits


def valid_request_id(given: str) -> bool:
    """Whether a client's X-Request-ID is sane enough to carry into the logs."""
    return _ACCEPTED_ID.match(given) is not None


def access_line(method: str, path: str, route: str | None, status: int, duration: float, rid: str) -> None:
    """Log a request's access line: ``"<method> <path> <status>"`` with those fields, its route
    template and its duration in milliseconds.

    When the line would reach only calibd's JSON log writer (as ``calibd serve``
    configures it), its fields are queued as a tuple and the writer thread
    formats them: the request pays for an append, not for a LogRecord, the
    logging module's handler walk and the JSON encoding. Otherwise (another
    handler or a filter in the way, tests' capturing handlers included) it is
    logged as any record is.
    """
    handler = _sole_writer()
    if handler is not None:
        handler.queue_access((time.time(), rid, method, path, route, status, duration))
        return
    if access_logger.isEnabledFor(logging.INFO):
        # access_logger.info(...) without its search of the stack for the caller's
        # file and line, which no access line shows: the same record, handlers and filters.
        access_logger.handle(
            access_logger.makeRecord(
                access_logger.name, logging.INFO, "(unknown file)", 0, "%s %s %d", (method, path, status), None,
                extra={"method": method, "path": path, "route": route, "status": status,
                       "duration_ms": round(duration * 1000, 3)},
            )
        )


def _sole_writer() -> BackgroundStreamHandler | None:
    """The JSON log writer, if it is the only handler an access record would reach and nothing
    (a filter, a level) would stop or change it there; else None."""
    logger = access_logger
    if logger.disabled or logger.filters or not logger.isEnabledFor(logging.INFO):
        return None
    found = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if (found is not None or type(handler) is not BackgroundStreamHandler or handler.filters
                    or type(handler.formatter) is not JsonFormatter or handler.level > logging.INFO):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def format_access(entry: tuple) -> str:
    """The JSON line of a queued access entry: what JsonFormatter makes of the access record."""
    created, rid, method, path, route, status, duration = entry
    line = {
        "time": _utc_milliseconds(created),
        "level": "info",
        "logger": access_logger.name,
        "message": f"{method} {path} {status}",
        "request_id": rid,
        "method": method,
        "path": path,
        "route": route,
        "status": status,
        "duration_ms": round(duration * 1000, 3),
    }
    try:
        return orjson.dumps(line).decode()
    except orjson.JSONEncodeError:  # a path with a lone surrogate
        return json.dumps(line, default=str)
