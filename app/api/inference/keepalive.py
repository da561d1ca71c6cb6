"""A small keep-alive HTTP/1.1 client for transformer mode's REST predictors.

It does one thing: POST a body to a predictor and read the answer, over connections kept open
between requests, at most ``limit`` of them (in use and idle together), each request within
``timeout``. Responses are parsed by httptools (uvicorn's parser: Content-Length or chunked).
Against a general client (aiohttp) it takes about a sixth of the CPU time per request, which on
the transformer's path is latency added to every call (benchmarks/oip.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict
from urllib.parse import urlsplit

import httptools

#: A response: its status, its Inference-Header-Content-Length (if any), and its body.
Answer = tuple[int, "str | None", bytes]


class Unreachable(OSError):
    """The predictor closed the connection, or answered with something that is not HTTP."""


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; httptools calls back as the response arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.open = False
        self._reset()

    def _reset(self) -> None:
        self.header_length: str | None = None
        self.chunks: list[bytes] = []
        self.started = False

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(Unreachable(f"not an HTTP response: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(Unreachable("the connection was closed"))

    # -- httptools callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self.header_length = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.open = False
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), self.header_length, b"".join(self.chunks)))

    # -- one request ----------------------------------------------------------------------------
    async def send(self, request: bytes) -> Answer:
        self._reset()
        self.waiter = self.loop.create_future()
        self.transport.write(request)
        try:
            return await self.waiter
        finally:
            self.waiter = None

    def _fail(self, error: Exception) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)


class Pool:
    """Kept-alive connections to any number of predictors, at most ``limit`` open in all."""

    def __init__(self, limit: int, timeout: float):
        self.timeout = timeout
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = defaultdict(list)
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes) -> Answer:
        """POST ``body`` (JSON) to ``url``. Raises TimeoutError, or OSError when the predictor
        cannot be reached or drops the connection."""
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        key = (parts.scheme, parts.hostname, port)
        host = parts.netloc.rpartition("@")[2]
        request = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        async with asyncio.timeout(self.timeout), self._slots:
            connection = self._take(key)
            if connection is not None:
                try:
                    return self._keep(key, connection, await connection.send(request))
                except Unreachable:
                    if connection.started:  # it closed in the middle of an answer: not a keep-alive timeout
                        raise
                    # A kept-alive connection the predictor had closed: inference changes nothing there, so send again.
                except BaseException:
                    connection.transport.close()
                    raise
            connection = await self._connect(key, secure)
            try:
                return self._keep(key, connection, await connection.send(request))
            except BaseException:
                connection.transport.close()
                raise

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle[key]
        while idle:
            connection = idle.pop()
            if connection.open:
                return connection
        return None

    def _keep(self, key: tuple[str, str, int], connection: _Connection, answer: Answer) -> Answer:
        if connection.open:
            self._idle[key].append(connection)
        return answer

    async def _connect(self, key: tuple[str, str, int], secure: bool) -> _Connection:
        loop = asyncio.get_running_loop()
        if secure and self._tls is None:
            self._tls = ssl.create_default_context()
        _, connection = await loop.create_connection(
            lambda: _Connection(loop), key[1], key[2], ssl=self._tls if secure else None
        )
        return connection

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
