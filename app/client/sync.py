"""The synchronous client."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from .api import API
from .transport import Attempt, Call, Operation, Sleep

class Client(API):
    """A blocking client. Use as a context manager, or call ``close()``.

    ``url`` defaults to CALIBD_URL (else http://127.0.0.1:8000), ``api_key`` to CALIBD_API_KEY.
    ``timeout`` is in seconds; fits may take up to ``fit_timeout``. ``retries``, ``backoff`` and
    ``max_retry_delay`` bound the safe retries described in the module docstring.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0, **options: Any):
        super().__init__(url, api_key, timeout, **options)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _attempt(self, call: Call) -> httpx.Response | httpx.TransportError:
        try:
            with self._request(call) as request:
                return self.http.request(**request)
        except httpx.TransportError as error:
            return error

    def _drive(self, operation: Operation) -> Iterator[Any]:
        steps = self._sent(operation)
        answer = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = None
            if isinstance(step, Attempt):
                answer = self._attempt(step.call)
            elif isinstance(step, Sleep):
                time.sleep(step.seconds)
            else:
                yield step.value

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        if kind == "iterate":

            @functools.wraps(func)
            def iterate(self: Client, *args: Any, **kwargs: Any) -> Iterator[Any]:
                yield from self._drive(func(self, *args, **kwargs))

            return iterate

        @functools.wraps(func)
        def call(self: Client, *args: Any, **kwargs: Any) -> Any:
            steps = self._drive(func(self, *args, **kwargs))
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            raise RuntimeError(f"{func.__name__} yielded items")  # pragma: no cover

        return call
