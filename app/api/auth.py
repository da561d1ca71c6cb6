"""API keys with scopes: ``Authorization: Bearer <key>``.

Auth is on whenever any key exists. Each route requires one scope; ``admin``
holds every scope. A missing or unknown key gets 401, a key without the
scope 403. Keys are checked in memory (``KeyRing``), so the hot path does not
touch the database.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..storage.keys import KeyInfo
from .problems import Problem
from .state import services

bearer = HTTPBearer(auto_error=False, description="an API key: calibd keys create --scope ...")


def require(scope: str):
    """A dependency that lets the request through if its key holds ``scope`` (or admin)."""

    async def check(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> KeyInfo | None:
        ring = services(request).keyring
        if not ring.loaded:  # fail closed: the database was away since start
            raise Problem(503, "API keys could not be read yet (database unavailable)", headers={"Retry-After": "5"})
        if not ring.enabled:
            return None
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise Problem(401, "an API key is required: send Authorization: Bearer <key>", headers=challenge)
        info = ring.check(credentials.credentials)
        if info is None:
            raise Problem(401, "the API key is unknown, expired or revoked", headers=challenge)
        if scope not in info.scopes and "admin" not in info.scopes:
            raise Problem(403, f"this API key lacks the {scope!r} scope")
        return info

    check.__name__ = f"require_{scope}"
    return Depends(check)


REQUIRE_ADMIN = require("admin")
REQUIRE_CALIBRATE = require("calibrate")
REQUIRE_FEEDBACK = require("feedback")
REQUIRE_READ = require("read")
