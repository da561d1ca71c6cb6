"""The asynchronous client: the same calls as coroutines."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from .api import API
from .transport import Attempt, Call, Operation, Sleep

class AsyncClient(API):
    """The same methods as ``Client``, as coroutines; ``calibrators()`` is an async iterator.

    Use as ``async with AsyncClient() as calibd:``, or call ``await aclose()``.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0, **options: Any):
        super().__init__(url, api_key, timeout, **options)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _attempt(self, call: Call) -> httpx.Response | httpx.TransportError:
        try:
            with self._request(call) as request:
                return await self.http.request(**request)
        except httpx.TransportError as error:
            return error

    async def _drive(self, operation: Operation, results: list[Any]) -> AsyncIterator[Any]:
        import asyncio

        steps = self._sent(operation)
        answer = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                results.append(done.value)
                return
            answer = None
            if isinstance(step, Attempt):
                answer = await self._attempt(step.call)
            elif isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
            else:
                yield step.value

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        if kind == "iterate":

            @functools.wraps(func)
            async def iterate(self: AsyncClient, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async for item in self._drive(func(self, *args, **kwargs), []):
                    yield item

            return iterate

        @functools.wraps(func)
        async def call(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
            results: list[Any] = []
            async for _ in self._drive(func(self, *args, **kwargs), results):
                raise RuntimeError(f"{func.__name__} yielded items")  # pragma: no cover
            return results[0]

        return call
