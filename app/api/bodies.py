"""Reading request bodies: size limits, content types and JSON.

Large arrays never pass through per-element pydantic validation: bodies are
parsed with orjson and their arrays validated as numpy arrays by the core.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import Problem, problem_response


class BodyTooLarge(Problem):
    def __init__(self, limit: int):
        super().__init__(413, f"request body exceeds the limit of {limit} bytes (CALIBD_MAX_BODY_BYTES)")


class BodySizeLimit:
    """Refuse bodies over ``max_bytes`` with 413, before reading them in full.

    A declared Content-Length over the limit is refused without reading the
    body at all; a chunked body is counted as it streams and cut off at the
    limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    response = problem_response(413, BodyTooLarge(self.max_bytes).detail, headers={"Connection": "close"})
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


def media_type(headers: Any) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def require_json(headers: Any) -> None:
    kind = media_type(headers)
    if kind and kind != "application/json" and not kind.endswith("+json"):
        raise Problem(415, f"expected Content-Type: application/json, got {kind}")


def parse_json(body: bytes) -> Any:
    """Parse a JSON body. NaN and Infinity literals are accepted here so that
    validation can point at the element, instead of failing the whole body."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise Problem(400, f"body is not valid JSON: {error}") from None


def parse_json_object(body: bytes) -> dict[str, Any]:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise Problem(400, "body must be a JSON object")
    return data
