"""Errors a service raises about the request it was given (the routes answer them with a 422)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request value is wrong: ``pointer`` is the JSON pointer of the value, ``detail`` says why."""

    def __init__(self, pointer: str, detail: str):
        self.pointer = pointer
        self.detail = detail
        super().__init__(f"{pointer}: {detail}")


class FitFailed(Exception):
    """A fit that did not store a version: the holdout or options were refused (``status`` 4xx, with
    ``errors`` locating each value), or no fit worker was free (503, ``retry_after`` seconds)."""

    def __init__(self, status: int, detail: str, errors: list[dict[str, str]] | None = None,
                 retry_after: int | None = None):
        self.status = status
        self.detail = detail
        self.errors = errors or []
        self.retry_after = retry_after
        super().__init__(detail)
