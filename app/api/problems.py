"""RFC 9457 problem details: every error calibd returns has this shape.

    {"type": "urn:calibd:problem:invalid-input", "title": "Invalid input",
     "status": 422, "detail": "...",
     "errors": [{"pointer": "/holdout/scores/3", "detail": "must be finite"}]}
"""

from __future__ import annotations

import logging
import re
import time
from http import HTTPStatus
from typing import Any

import orjson
import sqlalchemy.exc
import sqlalchemy.orm.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..calibration import CalibrationInputError
from ..services.errors import FitFailed
from ..storage.db import storage_fault
from ..storage.repository import InvalidCursor, NoCurrentVersion, NotFound
from .logs import request_id

try:
    import psycopg
except ImportError:  # a SQLite-only install
    psycopg = None

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
    502: "bad-gateway",
    503: "unavailable",
    504: "gateway-timeout",
    507: "insufficient-storage",
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


def problem_response(
    status: int, detail: str, errors: list[dict[str, str]] | None = None, headers=None, oip: bool = False
) -> Response:
    """The problem as application/problem+json; ``oip``: as application/json with the inference
    protocol's ``error`` field too (what its clients read), for the /v2 routes."""
    body: dict[str, Any] = {
        "type": f"urn:calibd:problem:{TYPES.get(status, 'error')}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if errors:
        body["errors"] = errors
    if oip:
        body["error"] = detail
        return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)
    return Response(orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers)


def is_oip(scope: Any) -> bool:
    """Whether the request is one of the inference protocol's (/v2): its errors carry ``error``."""
    path = scope["path"]
    return path == "/v2" or path.startswith("/v2/")


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


#: The documented shape of every error (components/schemas/Problem in /openapi.json).
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "urn:calibd:problem:<kind>"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["pointer", "detail"],
                "properties": {"pointer": {"type": "string", "description": "JSON pointer into the request"}, "detail": {"type": "string"}},
            },
        },
    },
}

#: The inference protocol's errors (/v2): the problem's fields, and the protocol's own ``error``.
INFERENCE_ERROR_SCHEMA: dict[str, Any] = {
    **PROBLEM_SCHEMA,
    "title": "InferenceError",
    "description": "the inference protocol's error (`error`), with RFC 9457 problem details beside it",
    "required": ["error", *PROBLEM_SCHEMA["required"]],
    "properties": {"error": {"type": "string"}, **PROBLEM_SCHEMA["properties"]},
}

DESCRIPTIONS = {
    400: "The body is not JSON, or not a JSON object",
    401: "No API key, or an unknown, expired or revoked one",
    403: "The API key lacks the scope this route needs",
    404: "No such calibrator, version or key",
    409: "The calibrator has no current version",
    413: "The body exceeds CALIBD_MAX_BODY_BYTES (refused before it is read)",
    415: "Wrong Content-Type",
    422: "Invalid values: errors point into the request",
    503: "The database is unavailable (retry, see Retry-After) or read-only, or a fit ran past its time limit",
    507: "The database has no space left; nothing was recorded",
}


#: What a client is told when the database cannot take writes: retrying will not help.
STORAGE_FAULTS = {
    "full": (507, "the database has no space left (disk full); nothing was recorded until an operator frees space"),
    "read-only": (503, "the database is read-only (a standby, or its files are not writable); nothing was recorded"),
}


def note_storage_fault(request: Request, fault: str) -> None:
    """Remember the fault for /readyz (which then answers not ready for a while)."""
    state = getattr(request.app.state, "services", None)
    if state is not None:
        state.storage_fault = (fault, time.monotonic())


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Document the errors every route can answer with, as problem details.

    Routes declare their own 404 and 409; the statuses that auth and body
    reading produce are added here: 401, 403 and 503 wherever a key is
    checked, 400, 413, 415 and 422 wherever a body is read, 422 wherever a
    parameter is validated. Every 4xx and 5xx is application/problem+json.
    """
    schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    schema["components"]["schemas"]["InferenceError"] = INFERENCE_ERROR_SCHEMA
    reference = {"$ref": "#/components/schemas/Problem"}
    for path, operations in schema.get("paths", {}).items():
        oip = path == "/v2" or path.startswith("/v2/")
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            implied: set[int] = set()
            if operation.get("security"):
                implied |= {401, 403, 503}
            if "requestBody" in operation:
                implied |= {400, 413, 415, 422}
            if operation.get("parameters"):
                implied.add(422)
            for status in implied:
                responses.setdefault(str(status), {})
            for code, response in responses.items():
                if code[:1] in ("4", "5"):
                    status = int(code)
                    if response.get("description") in (None, "", "Additional Response", "Validation Error"):
                        response["description"] = DESCRIPTIONS.get(status, HTTPStatus(status).phrase)
                    if oip:
                        response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/InferenceError"}}}
                    else:
                        response["content"] = {PROBLEM_JSON: {"schema": reference}}
    components = schema["components"]["schemas"]
    text = orjson.dumps(schema.get("paths", {}))
    if b"#/components/schemas/HTTPValidationError" not in text:  # FastAPI's default 422, replaced above
        components.pop("HTTPValidationError", None)
        if b"#/components/schemas/ValidationError" not in text:
            components.pop("ValidationError", None)
    return schema


def allowed_methods(request: Request, given: str | None = None) -> list[str]:
    """Every method served on the request's path (the Allow header of a 405).

    Starlette's own Allow (``given``) names the methods of the first route on
    the path only; the methods the OpenAPI description lists for the path are
    added to it.
    """
    methods = {m.strip() for m in (given or "").split(",") if m.strip()}
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the problem shape, and document that shape."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> Response:
        return problem_response(exc.status, exc.detail, exc.errors, exc.headers, is_oip(request.scope))

    @app.exception_handler(FitFailed)
    async def on_fit_failed(request: Request, exc: FitFailed) -> Response:
        headers = None if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
        return problem_response(exc.status, exc.detail, exc.errors, headers, is_oip(request.scope))

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        errors = []
        for error in exc.errors():
            location = list(error["loc"])
            if location and location[0] in ("body", "query", "path", "header"):
                source = location.pop(0)
                if source != "body":
                    location.insert(0, source)
            errors.append({"pointer": pointer(*location), "detail": error["msg"]})
        detail = "; ".join(f"{e['pointer'] or '/'}: {e['detail']}" for e in errors)
        return problem_response(422, detail, errors, oip=is_oip(request.scope))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = exc.headers
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route on the path only.
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request, (headers or {}).get("Allow")))}
        return problem_response(exc.status_code, str(exc.detail), headers=headers, oip=is_oip(request.scope))

    @app.exception_handler(NotFound)
    async def on_not_found(request: Request, exc: NotFound) -> Response:
        return problem_response(404, str(exc), oip=is_oip(request.scope))

    @app.exception_handler(NoCurrentVersion)
    async def on_no_current(request: Request, exc: NoCurrentVersion) -> Response:
        return problem_response(409, str(exc), oip=is_oip(request.scope))

    @app.exception_handler(InvalidCursor)
    async def on_cursor(_request: Request, exc: InvalidCursor) -> Response:
        detail = "not a cursor issued by this service"
        return problem_response(422, f"/query/cursor: {detail}", [{"pointer": "/query/cursor", "detail": detail}])

    @app.exception_handler(sqlalchemy.exc.DataError)
    async def on_unstorable(request: Request, exc: Exception) -> Response:
        # The database refused a value of the request: a NUL character in a text,
        # a number out of its range. The request's fault, so 422, not 500.
        logger.warning("database refused a value on %s %s: %s", request.method, request.url.path, exc)
        detail = "a value in the request cannot be stored or looked up (a NUL character, or a number out of range)"
        return problem_response(422, detail, oip=is_oip(request.scope))

    @app.exception_handler(sqlalchemy.exc.IntegrityError)
    @app.exception_handler(sqlalchemy.orm.exc.StaleDataError)
    async def on_concurrent_change(request: Request, exc: Exception) -> Response:
        # A row this request wrote to, or referred to, went away meanwhile: the calibrator was
        # deleted (or changed) by a concurrent request. Nothing of this request was kept.
        logger.warning("concurrent change on %s %s: %s", request.method, request.url.path, exc)
        detail = "the calibrator was deleted or changed by a concurrent request; nothing was recorded"
        return problem_response(409, detail, oip=is_oip(request.scope))

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    @app.exception_handler(sqlalchemy.exc.InternalError)
    @app.exception_handler(sqlalchemy.exc.InterfaceError)
    @app.exception_handler(sqlalchemy.exc.TimeoutError)
    async def on_database_unavailable(request: Request, exc: Exception) -> Response:
        fault = storage_fault(exc)
        if fault is not None:
            logger.error("database cannot take writes (%s) on %s %s: %s", fault, request.method, request.url.path, exc)
            note_storage_fault(request, fault)
            return problem_response(*STORAGE_FAULTS[fault], oip=is_oip(request.scope))
        if isinstance(exc, sqlalchemy.exc.InternalError) or not isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
            return await on_unexpected(request, exc)
        logger.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        return problem_response(
            503, "the database is unavailable; nothing was recorded, retry shortly", headers={"Retry-After": "5"},
            oip=is_oip(request.scope),
        )

    if psycopg is not None:  # PostgreSQL's COPY runs on the driver's connection: its errors come unwrapped
        app.exception_handler(psycopg.Error)(on_database_unavailable)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        # The request id, as the edge's own 500 gives it, ties the answer to its log line.
        return problem_response(
            500, f"internal error; see the server log (request id {request_id.get()})", oip=is_oip(request.scope)
        )
