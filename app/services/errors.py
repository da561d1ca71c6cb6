"""Errors a service raises about the request it was given (the routes answer them with a 422)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request value is wrong: ``pointer`` is the JSON pointer of the value, ``detail`` says why."""

    def __init__(self, pointer: str, detail: str):
        self.pointer = pointer
        self.detail = detail
        super().__init__(f"{pointer}: {detail}")
