"""Idempotency keys: the receipt given to a request, kept a day so that a retry gets the same answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .db import transaction
from .models import IdempotencyRow
from .sql import Sessions


@dataclass(frozen=True)
class StoredRequest:
    """The answer given to a request with an Idempotency-Key, and the digest of that request."""

    response: dict[str, Any]
    request_sha256: str | None

    def same_request(self, request_sha256: str | None) -> bool:
        # Keys stored before digests were kept match any body, as they did then.
        return self.request_sha256 is None or request_sha256 is None or self.request_sha256 == request_sha256


class IdempotencyConflict(Exception):
    """Another request with the same Idempotency-Key committed first."""


def stored_response(sessions: Sessions, key: str) -> StoredRequest | None:
    """The answer already given to a request with this Idempotency-Key, if any."""
    with transaction(sessions) as session:
        row = session.execute(
            select(IdempotencyRow.response, IdempotencyRow.request_sha256).where(IdempotencyRow.key == key)
        ).first()
    return None if row is None else StoredRequest(row[0], row[1])


def remember(
    session: Session, key: str, calibrator_id: int, response: dict[str, Any], request_sha256: str | None, now: datetime
) -> None:
    """Store the receipt in the request's transaction (a concurrent twin then fails on the key)."""
    session.add(
        IdempotencyRow(key=key, calibrator_id=calibrator_id, response=response, request_sha256=request_sha256, created_at=now)
    )
    session.flush()
