"""Read timeouts for ``calibd serve``: uvicorn's HTTP protocol with header and body deadlines.

uvicorn closes a keep-alive connection that stays idle after an answer
(``timeout_keep_alive``), but a connection that sends half its headers, or a
body shorter than its Content-Length, stays open for ever, and the body's
spool file with it. ``TimedHTTPProtocol`` is uvicorn's own protocol plus two
deadlines (CALIBD_HEADER_TIMEOUT_SECONDS, CALIBD_BODY_TIMEOUT_SECONDS):

* headers: a connection has that long, from its opening or from the end of its
  previous answer, to send a request's headers whole; else it gets a 408 and is closed;
* body: a body that stops arriving for that long is abandoned: the connection is
  closed, the request sees a disconnect, and what it spooled is removed.

A request costs one clock read per arriving chunk; one timer a second per
serving process looks at the open connections.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..config import get_settings

_MESSAGE = b"request headers were not received in time"
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_MESSAGE)).encode() + b"\r\nconnection: close\r\n\r\n" + _MESSAGE
)


class TimedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP/1.1 protocol, with the header and body read timeouts."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = get_settings()
        self.header_timeout = settings.header_timeout_seconds
        self.body_timeout = settings.body_timeout_seconds
        #: Since when the next request's headers are awaited; when data last arrived.
        self.waiting_since = self.last_read = time.monotonic()
        _Watch.of(self.loop, min(self.header_timeout, self.body_timeout)).add(self)

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.waiting_since = time.monotonic()

    def overdue(self, now: float) -> bytes | None:
        """What to send before closing (b"": nothing) if a deadline has passed, else None."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return None
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # between requests: the next headers are awaited
            return REQUEST_TIMEOUT if now - self.waiting_since > self.header_timeout else None
        if cycle.more_body and not self.flow.read_paused and now - self.last_read > self.body_timeout:
            return b""  # the application answers; it sees a disconnect
        return None


class _Watch:
    """Looks at a loop's open connections every so often, and closes those past a deadline."""

    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float):
        self.loop = loop
        self.interval = interval
        self.connections: weakref.WeakSet[TimedHTTPProtocol] = weakref.WeakSet()
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, shortest: float) -> _Watch:
        watch = cls._by_loop.get(loop)
        if watch is None:
            watch = cls._by_loop[loop] = cls(loop, min(1.0, shortest / 4))
        return watch

    def add(self, protocol: TimedHTTPProtocol) -> None:
        self.connections.add(protocol)
        if self.timer is None:
            self.timer = self.loop.call_later(self.interval, self.sweep)

    def sweep(self) -> None:
        self.timer = None
        now = time.monotonic()
        for protocol in list(self.connections):
            answer = protocol.overdue(now)
            if answer is None:
                continue
            if answer:
                protocol.transport.write(answer)
            protocol.transport.close()
        if self.connections:
            self.timer = self.loop.call_later(self.interval, self.sweep)


__all__ = ["REQUEST_TIMEOUT", "TimedHTTPProtocol"]
