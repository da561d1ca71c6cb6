"""RFC 9457 problem details: every error calibd returns has this shape.

    {"type": "urn:calibd:problem:invalid-input", "title": "Invalid input",
     "status": 422, "detail": "...",
     "errors": [{"pointer": "/holdout/scores/3", "detail": "must be finite"}]}
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..calibration import CalibrationInputError
from ..storage.repository import InvalidCursor, NoCurrentVersion, NotFound

logger = logging.getLogger("calibd")

PROBLEM_JSON = "application/problem+json"

# The problem type for each status calibd uses; clients can switch on these.
TYPES = {
    400: "malformed-request",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "body-too-large",
    415: "unsupported-media-type",
    422: "invalid-input",
    500: "internal-error",
    503: "unavailable",
}


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) from path segments."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class Problem(Exception):
    """Raise to answer with a problem response."""

    def __init__(
        self,
        status: int,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = errors or []
        self.headers = headers or {}

    @classmethod
    def invalid(cls, at: str, detail: str) -> Problem:
        """A 422 pointing at one place in the request."""
        return cls(422, detail, [{"pointer": at, "detail": detail}])


def problem_response(status: int, detail: str, errors: list[dict[str, str]] | None = None, headers=None) -> Response:
    body: dict[str, Any] = {
        "type": f"urn:calibd:problem:{TYPES.get(status, 'error')}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers)


def input_error(error: CalibrationInputError, prefix: tuple[str | int, ...], fields: dict[str, tuple] | None = None) -> Problem:
    """Turn a core validation error into a 422 whose pointer locates it in the request.

    ``prefix`` is where the arrays sit (``("holdout",)`` for fits); ``fields``
    overrides the location of particular fields (``input`` and ``options.*``
    sit at the top level of a fit request).
    """
    head, _, rest = error.field.partition(".")
    location = (fields or {}).get(head)
    if location is None:
        location = prefix + (head,) if head not in ("options", "input", "method") else (head,)
    parts = location + tuple(p for p in rest.split(".") if p) + tuple(error.index or ())
    at = pointer(*parts)
    return Problem(422, f"{at}: {error.detail}", [{"pointer": at, "detail": error.detail}])


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the problem shape."""

    @app.exception_handler(Problem)
    async def on_problem(_request: Request, exc: Problem) -> Response:
        return problem_response(exc.status, exc.detail, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_request: Request, exc: RequestValidationError) -> Response:
        errors = []
        for error in exc.errors():
            location = list(error["loc"])
            if location and location[0] in ("body", "query", "path", "header"):
                source = location.pop(0)
                if source != "body":
                    location.insert(0, source)
            errors.append({"pointer": pointer(*location), "detail": error["msg"]})
        detail = "; ".join(f"{e['pointer'] or '/'}: {e['detail']}" for e in errors)
        return problem_response(422, detail, errors)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException) -> Response:
        return problem_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(NotFound)
    async def on_not_found(_request: Request, exc: NotFound) -> Response:
        return problem_response(404, str(exc))

    @app.exception_handler(NoCurrentVersion)
    async def on_no_current(_request: Request, exc: NoCurrentVersion) -> Response:
        return problem_response(409, str(exc))

    @app.exception_handler(InvalidCursor)
    async def on_cursor(_request: Request, exc: InvalidCursor) -> Response:
        detail = "not a cursor issued by this service"
        return problem_response(422, f"/query/cursor: {detail}", [{"pointer": "/query/cursor", "detail": detail}])

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    @app.exception_handler(sqlalchemy.exc.InterfaceError)
    @app.exception_handler(sqlalchemy.exc.TimeoutError)
    async def on_database_unavailable(request: Request, exc: Exception) -> Response:
        logger.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        return problem_response(
            503, "the database is unavailable; nothing was recorded, retry shortly", headers={"Retry-After": "5"}
        )

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(500, "internal error; see the server log")
