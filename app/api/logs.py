"""Structured logs: JSON lines, each with the request id of the request it belongs to.

A request's id is its X-Request-ID header when it sends a sane one, else a
new random id; the response echoes it. Every log line written while the
request is handled carries it, and one access line per request records the
route, status and duration.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import os
import re
import sys
import time
from datetime import datetime, timezone

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import problem_response

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


def configure_logging(level: str = "INFO") -> None:
    """Send calibd's and uvicorn's logs to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("calibd", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False
    # calibd writes its own access lines, with the request id.
    logging.getLogger("uvicorn.access").disabled = True


def _new_id() -> str:
    """``uuid.uuid4().hex`` (version 4, RFC 4122 variant) without building a UUID object."""
    value = int.from_bytes(os.urandom(16), "big")
    value = (value & ~(0xF000 << 64) | (4 << 76)) & ~(0xC000 << 48) | (0x8000 << 48)
    return f"{value:032x}"


class RequestContext:
    """Assigns each request its id, echoes it as X-Request-ID, and writes the access line."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = given if given and _ACCEPTED_ID.match(given) else _new_id()
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500
        started_response = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status = message["status"]
                started_response = True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # Answered here rather than by Starlette's outermost handler, so that the
            # error's log line and the 500 both carry the request id.
            if started_response:
                raise
            logging.getLogger("calibd").exception("unhandled error on %s %s", scope["method"], scope["path"])
            await problem_response(500, f"internal error; see the server log (request id {rid})")(scope, receive, send_with_id)
        finally:
            if access_logger.isEnabledFor(logging.INFO):
                route = scope.get("route")
                # access_logger.info(...) without its search of the stack for the caller's
                # file and line, which no access line shows: the same record, handlers and filters.
                access_logger.handle(
                    access_logger.makeRecord(
                        access_logger.name,
                        logging.INFO,
                        "(unknown file)",
                        0,
                        "%s %s %d",
                        (scope["method"], scope["path"], status),
                        None,
                        extra={
                            "method": scope["method"],
                            "path": scope["path"],
                            "route": getattr(route, "path", None),
                            "status": status,
                            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                        },
                    )
                )
            request_id.reset(token)
