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
import re
import sys
import time
import uuid
from datetime import datetime, timezone

from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_ACCEPTED_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
access_logger = logging.getLogger("calibd.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and any extra fields."""

    STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in self.STANDARD})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


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


class RequestContext:
    """Assigns each request its id, echoes it as X-Request-ID, and writes the access line."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
        rid = given if given and _ACCEPTED_ID.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            access_logger.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": getattr(route, "path", None),
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 3),
                },
            )
            request_id.reset(token)
