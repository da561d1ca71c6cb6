"""The errors a call raises: ``CalibdError`` and one subclass per kind of problem the service answers."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any


class CalibdError(Exception):
    """An error answer from calibd, with its RFC 9457 problem details.

    ``status`` (int), ``title``, ``detail``, ``errors`` (a list of
    ``{"pointer": ..., "detail": ...}`` into the request), ``type`` and
    ``problem``, the whole problem document.
    """

    status: int | None = None

    def __init__(
        self,
        status: int | None,
        title: str,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        problem: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.problem = problem or {}
        self.type = self.problem.get("type")
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.status} {self.title}" if self.status else self.title
        return f"{head}: {self.detail}" if self.detail else head


class BadRequest(CalibdError):
    """400: the body is not JSON, or not a JSON object."""


class Unauthorized(CalibdError):
    """401: no API key, or an unknown, expired or revoked one (set CALIBD_API_KEY)."""


class Forbidden(CalibdError):
    """403: the API key lacks the scope the call needs."""


class NotFound(CalibdError):
    """404: no such calibrator, version, key or route."""


class Conflict(CalibdError):
    """409: for instance a calibrator with no current version."""


class PayloadTooLarge(CalibdError):
    """413: the body is over the service's CALIBD_MAX_BODY_BYTES."""


class UnsupportedMediaType(CalibdError):
    """415: wrong Content-Type."""


class InvalidInput(CalibdError):
    """422: invalid values; ``errors`` point into the request (``/holdout/scores/3``)."""


class ServerError(CalibdError):
    """500 and other 5xx answers but 503."""


class Unavailable(CalibdError):
    """503: the service or its database is unavailable, or a fit ran past its time limit."""


class ConnectionFailed(Unavailable):
    """calibd could not be reached, or the connection broke (``status`` is None)."""


ERRORS: dict[int, type[CalibdError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidInput,
    503: Unavailable,
}


def error_from_problem(status: int, problem: Mapping[str, Any], retry_after: float | None = None) -> CalibdError:
    """The typed error of a problem-details document."""
    kind = ERRORS.get(status, ServerError if status >= 500 else CalibdError)
    title = problem.get("title") or phrase(status)
    return kind(status, str(title), str(problem.get("detail") or ""), list(problem.get("errors") or []), dict(problem), retry_after)


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
