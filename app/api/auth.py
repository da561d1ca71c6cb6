"""API keys with scopes: ``Authorization: Bearer <key>``.

Auth is on whenever any key exists. Each route requires one scope; ``admin``
holds every scope. A missing or unknown key gets 401, a key without the
scope 403. Keys are checked in memory (``KeyRing``), so the hot path does not
touch the database.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..storage.keys import KeyInfo, KeyRing
from .problems import Problem
from .state import services_of

bearer = HTTPBearer(auto_error=False, description="an API key: calibd keys create --scope ...")


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value, else None (as ``bearer`` reads it)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if token and scheme.lower() == "bearer" else None


def require(*scopes: str):
    """A dependency that lets the request through if its key holds one of ``scopes`` (or admin)."""

    async def check(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> KeyInfo | None:
        return authorize(services_of(request).keyring, None if credentials is None else credentials.credentials, scopes)

    check.__name__ = "require_" + "_or_".join(scopes)
    return Depends(check)


def authorize(ring: KeyRing, key: str | None, scopes: tuple[str, ...]) -> KeyInfo | None:
    """The key's holder if it may use a route needing one of ``scopes``; else a 401, 403 or 503 Problem.

    Shared by the REST routes and the gRPC service (which reads the key from its metadata).
    """
    if not ring.loaded:  # fail closed: the database was away since start
        raise Problem(503, "API keys could not be read yet (database unavailable)", headers={"Retry-After": "5"})
    if not ring.enabled:
        return None
    challenge = {"WWW-Authenticate": "Bearer"}
    if key is None:
        raise Problem(401, "an API key is required: send Authorization: Bearer <key>", headers=challenge)
    info = ring.check(key)
    if info is None:
        raise Problem(401, "the API key is unknown, expired or revoked", headers=challenge)
    if "admin" not in info.scopes and not any(scope in info.scopes for scope in scopes):
        wanted = " or ".join(repr(scope) for scope in scopes)
        raise Problem(403, f"this API key lacks the {wanted} scope")
    return info


REQUIRE_ADMIN = require("admin")
REQUIRE_CALIBRATE = require("calibrate")
REQUIRE_FEEDBACK = require("feedback")
REQUIRE_READ = require("read")
