"""Requests without I/O: the calls, their replies, the retry policy.

Every API call is a generator that yields the HTTP requests it needs (``Call``) and returns the
result; ``Client`` and ``AsyncClient`` differ only in how they send them.
"""

from __future__ import annotations

import email.utils
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx
import orjson

from .errors import CalibdError, ConnectionFailed, error_from_problem, phrase

@dataclass
class Call:
    """One HTTP request an operation needs."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    files: Callable[[], dict[str, Any]] | None = None  # opened afresh for every attempt
    data: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Safe to send again after it may have arrived (retried on broken connections and 503).
    idempotent: bool = True
    #: "json", "bytes", "text" or "none": how to read a successful answer.
    expect: str = "json"
    long: bool = False  # a fit: the read timeout is fit_timeout

    def content(self) -> bytes | None:
        return None if self.json is None else orjson.dumps(self.json, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: httpx.Headers
    body: Any


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Item:
    value: Any


@dataclass(frozen=True)
class Attempt:
    """Send ``call`` once; the client answers with the ``httpx.Response``, or the
    ``httpx.TransportError`` it raised."""

    call: Call


Operation = Generator[Any, Any, Any]


def api_call(func: Callable[..., Operation]) -> Callable[..., Operation]:
    """Mark a generator method as an API call; each client wraps it to send its requests."""
    func._calibd_operation = "call"  # type: ignore[attr-defined]
    return func


def api_iteration(func: Callable[..., Operation]) -> Callable[..., Operation]:
    """Mark a generator method that yields items (``Item``) to its caller, such as a paged list."""
    func._calibd_operation = "iterate"  # type: ignore[attr-defined]
    return func


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max((when - datetime.now(timezone.utc)).total_seconds(), 0.0)


#: Transport errors raised before any of the request was sent.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: ``retries`` more attempts at most, waiting ``Retry-After`` when the
    service says (capped at ``max_delay``), else ``backoff`` x 2^attempt with jitter."""

    retries: int = 3
    backoff: float = 0.5
    max_delay: float = 30.0

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` (0-based), or None: give up."""
        if attempt >= self.retries:
            return None
        if retry_after is not None:
            return min(retry_after, self.max_delay)
        return min(self.backoff * 2**attempt * (0.5 + random.random() / 2), self.max_delay)

    def after_error(self, call: Call, error: httpx.TransportError, attempt: int) -> float | None:
        # A connection that was never made carried nothing: any call may go again.
        if isinstance(error, NOT_SENT) or call.idempotent:
            return self.wait(attempt, None)
        return None

    def after_response(self, call: Call, response: httpx.Response, attempt: int) -> float | None:
        if response.status_code != 503 or not call.idempotent:
            return None
        return self.wait(attempt, parse_retry_after(response.headers.get("Retry-After")))


def decode(call: Call, response: httpx.Response) -> Reply:
    if response.status_code >= 400:
        raise error_from_response(response)
    if call.expect == "none" or response.status_code == 204:
        body: Any = None
    elif call.expect == "bytes":
        body = response.content
    elif call.expect == "text":
        body = response.text
    else:
        body = orjson.loads(response.content)
    return Reply(response.status_code, response.headers, body)


def connection_failed(url: str, error: httpx.TransportError) -> ConnectionFailed:
    reason = str(error) or type(error).__name__
    what = "cannot reach" if isinstance(error, NOT_SENT) else "lost the connection to"
    return ConnectionFailed(None, "Connection failed", f"{what} {url}: {reason}")



def error_from_response(response: httpx.Response) -> CalibdError:
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):  # not calibd's answer (a proxy's page, say)
        text = " ".join(response.text.split())[:200]
        problem = {"title": phrase(response.status_code), "status": response.status_code, "detail": text}
    return error_from_problem(response.status_code, problem, retry_after)
