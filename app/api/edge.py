"""The one ASGI layer around every request: request id, body limit, duration histogram, access line.

One layer instead of three middlewares (one coroutine, one ``send`` wrapper
and one header scan a request, not three of each), and a shortcut for the
routes served by plain ASGI endpoints (``asgi_route``): a POST to
``/calibrate`` goes from here straight to its endpoint, without the route
table's regular expressions, FastAPI's dependency resolution or its request
and response objects. Those endpoints check their key, read their body and
answer problems themselves; their OpenAPI description is the APIRoute
registered for them, which serves the same endpoint when reached by routing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import authorize, bearer_token
from .bodies import BodyTooLarge, parse_json_object, require_json
from .logs import access_line, new_request_id, request_id, valid_request_id
from .observability import observe_duration
from .problems import Problem, is_oip, problem_response
from ..services.container import Services

#: An endpoint served without FastAPI's machinery: an ASGI app.
AsgiEndpoint = Callable[[Scope, Receive, Send], Awaitable[None]]


def asgi_route(router: APIRouter, path: str, endpoint: AsgiEndpoint, methods: list[str], **documentation: Any) -> None:
    """Serve ``endpoint`` (a plain ASGI app) at ``path``, documented as ``router.add_api_route`` would document it.

    The route (an ``AsgiRoute``) carries the OpenAPI description
    (``documentation``: summary, dependencies for its security, openapi_extra,
    responses...), but FastAPI never resolves those dependencies: the endpoint
    checks the key itself. ``Edge``'s shortcut serves it past the route table (a path with
    parameters by its pattern, the parameters in ``scope["path_params"]``); routing reaches the
    same endpoint.
    """

    async def documented() -> None:  # pragma: no cover - never called: AsgiRoute.handle calls ``endpoint``
        raise AssertionError("served by its ASGI endpoint")

    documented.__name__ = endpoint.__name__  # the operationId FastAPI derives from it
    documented.asgi = endpoint  # type: ignore[attr-defined]  # kept when FastAPI copies the route
    router.add_api_route(path, documented, methods=methods, route_class_override=AsgiRoute, **documentation)


class AsgiRoute(APIRoute):
    """An APIRoute whose requests go to its endpoint's ASGI app, without FastAPI's request handling."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in self.methods:
            await super().handle(scope, receive, send)  # the 405 any route answers
            return
        await self.endpoint.asgi(scope, receive, send)


def _asgi_routes(routes: list, prefix: str = ""):
    """(full path, route) of every AsgiRoute, routers included by FastAPI's ``include_router`` too."""
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI keeps included routers as such
        if included is not None:
            yield from _asgi_routes(included.routes, prefix + getattr(route.include_context, "prefix", ""))
        elif isinstance(route, AsgiRoute):
            yield prefix + route.path, route


class Edge:
    """Request id (X-Request-ID in and out), the body limit, the duration histogram and the access line.

    * The id is the request's X-Request-ID when it is sane, else a new random
      one; it is echoed in the answer and set in ``request_id`` while the
      request runs, so every log line written meanwhile carries it.
    * A declared Content-Length over ``max_bytes`` is refused with 413 before
      the body is read; a chunked body is counted as it streams and cut off at
      the limit.
    * An exception no handler answered becomes a 500 problem carrying the
      request id (logged with it).
    * One access line (``logs.access_line``) and one histogram observation by
      route template, method and status per request.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes
        self._shortcuts: dict[tuple[str, str], AsgiRoute] = {}
        #: Routes with path parameters (the inference protocol's infer): matched by their pattern.
        self._templated: list[tuple[frozenset[str], Any, dict, AsgiRoute]] = []
        self._routes_seen = -1

    def _shortcut(self, scope: Scope) -> AsgiRoute | None:
        routes = scope["app"].router.routes
        if len(routes) != self._routes_seen:  # routes added since (tests add some): rebuild
            table: dict[tuple[str, str], AsgiRoute] = {}
            templated = []
            for path, route in _asgi_routes(routes):
                if "{" not in path:
                    for method in route.methods:
                        table.setdefault((method, path), route)
                else:
                    pattern, _, convertors = compile_path(path)
                    templated.append((frozenset(route.methods), pattern, convertors, route))
            self._shortcuts, self._templated, self._routes_seen = table, templated, len(routes)
        route = self._shortcuts.get((scope["method"], scope["path"]))
        if route is None and self._templated:
            for methods, pattern, convertors, candidate in self._templated:
                match = pattern.match(scope["path"]) if scope["method"] in methods else None
                if match is not None:
                    scope["path_params"] = {k: convertors[k].convert(v) for k, v in match.groupdict().items()}
                    return candidate
        return route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        rid = None
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                given = value.decode("latin-1")
                rid = given if valid_request_id(given) else None
            elif key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    scope["calibd.refused"] = True
        if rid is None:
            rid = new_request_id()
        token = request_id.set(rid)
        rid_header = (b"x-request-id", rid.encode())
        status = 500
        started_response = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status = message["status"]
                started_response = True
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        try:
            if scope.get("calibd.refused"):
                refused = problem_response(
                    413, BodyTooLarge(self.max_bytes).detail, headers={"Connection": "close"}, oip=is_oip(scope)
                )
                await refused(scope, receive, send_with_id)
                return
            shortcut = self._shortcut(scope)
            if shortcut is not None:
                scope["route"] = shortcut
                await shortcut.endpoint.asgi(scope, receive, send_with_id)  # it reads the body within the limit itself
            else:
                await self.app(scope, self._limited(receive), send_with_id)
        except Exception:
            # Answered here rather than by Starlette's outermost handler, so that the
            # error's log line and the 500 both carry the request id.
            if started_response:
                raise
            logging.getLogger("calibd").exception("unhandled error on %s %s", scope["method"], scope["path"])
            await problem_response(
                500, f"internal error; see the server log (request id {rid})", oip=is_oip(scope)
            )(scope, receive, send_with_id)
        finally:
            duration = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None)
            observe_duration(template or "unmatched", scope["method"], status, duration)
            access_line(scope["method"], scope["path"], template, status, duration, rid)
            request_id.reset(token)

    def _limited(self, receive: Receive) -> Receive:
        """``receive``, raising BodyTooLarge (a 413 problem) once the body passes the limit."""
        limit = self.max_bytes
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        return limited_receive


class EdgeFirst(FastAPI):
    """FastAPI with ``Edge`` in front of all of it: an HTTP request meets Edge first, and a
    request for an ASGI endpoint (/calibrate) meets nothing else of the framework.

    Starlette's and FastAPI's own outer layers (the server-error handler, the body limit,
    the telemetry hook, the app's ``__call__``) cost a /calibrate request a tenth of its
    time, and did nothing for it: Edge already answers an unhandled error with a 500 problem
    and enforces the body limit. Every other request goes on through them as before.
    Lifespan and websocket scopes go straight to FastAPI.
    """

    edge: Edge | None = None

    def put_edge_in_front(self, max_bytes: int) -> None:
        self.edge = Edge(self._framework, max_bytes)

    async def _framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(self, scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edge = self.edge
        if edge is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: the endpoints find the services there
        await edge(scope, receive, send)


# -- what the ASGI endpoints share ---------------------------------------------------------------
async def json_request(scope: Scope, receive: Receive, services: Services, key_scope: str) -> tuple[dict, bytes]:
    """The request's JSON object and body, once its key holds ``key_scope`` and its Content-Type is JSON.

    The checks of a FastAPI route with ``require(key_scope)`` that reads its
    body with ``bodies.parse_json_object``, in the same order: key (401, 403,
    503), media type (415), size (413), JSON (400); but the nesting of a body
    orjson parsed is the caller's to check (``bodies.check_depth``), which its
    shape may spare.
    """
    authorization = content_type = None
    for key, value in scope["headers"]:
        if key == b"authorization":
            authorization = value.decode("latin-1")
        elif key == b"content-type":
            content_type = value.decode("latin-1")
    authorize(services.keyring, bearer_token(authorization), (key_scope,))
    if content_type != "application/json":  # the usual one needs no parsing
        require_json({"content-type": content_type or ""})
    body = await read_body(receive, services.settings.max_body_bytes)
    return parse_json_object(body, check_nesting=False), body


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; BodyTooLarge (413) once it passes ``limit`` bytes."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


_JSON_HEADER = (b"content-type", b"application/json")


async def send_json(send: Send, payload: bytes, status: int = 200) -> None:
    """Answer ``payload``, JSON already encoded."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(payload)).encode()), _JSON_HEADER]})
    await send({"type": "http.response.body", "body": payload})


async def answer_error(scope: Scope, receive: Receive, send: Send, error: Exception) -> None:
    """Answer an ASGI endpoint's exception as a routed request's would be answered: a Problem as
    its problem, another exception by the handler the app registered for its class; an
    exception without one is raised again (``Edge`` answers it with a 500)."""
    if isinstance(error, Problem):
        response = problem_response(error.status, error.detail, error.errors, error.headers, is_oip(scope))
    else:
        handlers = scope["app"].exception_handlers
        handler = next((handlers[kind] for kind in type(error).__mro__ if kind in handlers and kind is not Exception), None)
        if handler is None:
            raise error
        response = await handler(Request(scope, receive), error)
    await response(scope, receive, send)
