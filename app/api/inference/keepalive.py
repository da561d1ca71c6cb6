"""A small keep-alive HTTP/1.1 client for transformer mode's REST predictors.

It does one thing: POST a body to a predictor and read the answer, over connections kept open
between requests, at most ``limit`` of them (in use and idle together), each request within
``timeout``. Responses are parsed by httptools (uvicorn's parser: Content-Length or chunked).
Against a general client (aiohttp) it takes about a sixth of the CPU time per request, which on
the transformer's path is latency added to every call (benchmarks/oip.py).

Where it connects is checked at connect time: the predictor's host is resolved here, each address
held against the allow-list (CALIBD_PREDICTOR_ALLOW), and the connection made to an address that
passed, so that a DNS answer cannot move it elsewhere (https keeps the name for SNI and the
certificate). An answer larger than ``max_answer`` bytes is cut off as it streams in.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections import defaultdict
from functools import lru_cache

import httptools

from ...predictor_urls import AllowList, PredictorUrlError, parse

#: A response: its status, its Inference-Header-Content-Length (if any), and its body.
Answer = tuple[int, "str | None", bytes]


class Unreachable(OSError):
    """The predictor closed the connection, or answered with something that is not HTTP."""


class NotAllowed(OSError):
    """The predictor's URL is not a valid one, or none of its addresses is allowed."""


class TooLarge(OSError):
    """The predictor's answer is larger than the cap."""


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; httptools calls back as the response arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_answer: int):
        self.loop = loop
        self.max_answer = max_answer
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.open = False
        self._reset()

    def _reset(self) -> None:
        self.header_length: str | None = None
        self.chunks: list[bytes] = []
        self.started = False
        self.received = 0
        self.declared_too_large = False

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.open = True

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > self.max_answer:  # headers and body, as they stream in: stop at the cap
            self._fail(TooLarge(f"more than {self.max_answer} bytes"))
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(Unreachable(f"not an HTTP response: {error}"))
            return
        if self.declared_too_large:
            self._fail(TooLarge(f"a Content-Length above {self.max_answer} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._fail(Unreachable("the connection was closed"))

    # -- httptools callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"inference-header-content-length":
            self.header_length = value.decode("latin-1")
        elif lowered == b"content-length" and value.strip().isdigit() and int(value) > self.max_answer:
            self.declared_too_large = True

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
    """Kept-alive connections to any number of predictors, at most ``limit`` open in all, made only
    to addresses ``allow`` permits."""

    def __init__(self, limit: int, timeout: float, allow: AllowList, max_answer: int):
        self.timeout = timeout
        self.allow = allow
        self.max_answer = max_answer
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = defaultdict(list)
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes) -> Answer:
        """POST ``body`` (JSON) to ``url``. Raises TimeoutError; NotAllowed for a URL or address
        that is not allowed; TooLarge; or OSError when the predictor cannot be reached or drops
        the connection."""
        try:  # checked again here: a predictor stored before the rules, or by another path
            target = _target(url)
        except PredictorUrlError as error:
            raise NotAllowed(f"not a valid predictor URL: {error}") from None
        secure = target.scheme == "https"
        key = (target.scheme, target.host, target.port)
        host = url.split("://", 1)[1].split("/", 1)[0]  # as written: host[:port], the Host header
        request = (
            f"POST {target.path or '/'} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("ascii") + body
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
        """A connection to the first allowed address the host resolves to now (the address that was
        checked is the one connected to: no second lookup)."""
        loop = asyncio.get_running_loop()
        if secure and self._tls is None:
            self._tls = ssl.create_default_context()
        _, host, port = key
        addresses = await resolve(host, port)
        allowed = self.allow.connectable(host, port, addresses)
        if not allowed:
            raise NotAllowed(f"{host} resolves to {', '.join(addresses)}, none allowed by CALIBD_PREDICTOR_ALLOW")
        error: OSError | None = None
        for address in allowed:
            try:
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, self.max_answer), str(address), port,
                    ssl=self._tls if secure else None, server_hostname=host if secure else None,
                )
                return connection
            except OSError as failed:
                error = failed
        raise error

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()


@lru_cache(maxsize=1024)
def _target(url: str):
    return parse(url)  # the same few URLs on every request: parsed once


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection (an address resolves to itself), in
    the resolver's order, without repeats. Raises OSError (socket.gaierror) when it does not resolve."""
    try:
        return [str(ipaddress.ip_address(host))]  # no lookup (and no thread) for an address
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(info[4][0] for info in infos))
