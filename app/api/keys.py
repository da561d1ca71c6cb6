"""/keys: manage API keys (admin scope). The same as ``calibd keys``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..storage import keys
from ..storage.keys import KeyInfo, KeyNotFound
from ..storage.models import utcnow
from .auth import REQUIRE_ADMIN
from .problems import Problem
from .state import services_of
from .validation import json_response, read_json, request_body

router = APIRouter(tags=["keys"])

Scope = Literal["admin", "calibrate", "feedback", "read"]


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    scopes: list[Scope] = Field(min_length=1)
    expires_in_days: float | None = Field(default=None, gt=0, le=36500, description="null: never expires")
    description: str = Field(default="", max_length=200)


class KeyOut(BaseModel):
    key_id: str
    scopes: list[Scope]
    description: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class CreatedKeyOut(KeyOut):
    key: str = Field(description="the key itself: shown this once, store it now")


def key_out(info: KeyInfo) -> dict:
    return {
        "key_id": info.key_id,
        "scopes": list(info.scopes),
        "description": info.description,
        "created_at": info.created_at,
        "expires_at": info.expires_at,
        "revoked_at": info.revoked_at,
    }


@router.post(
    "/keys",
    status_code=201,
    summary="Create an API key (shown once)",
    dependencies=[REQUIRE_ADMIN],
    openapi_extra=request_body(("application/json", KeyRequest)),
    responses={201: {"model": CreatedKeyOut}},
)
async def create_key(request: Request) -> Response:
    body = await read_json(request, KeyRequest)
    services = services_of(request)
    expires = utcnow() + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    key, info = await run_in_threadpool(keys.create_key, services.sessions, list(body.scopes), expires, body.description)
    services.keyring.note(info, keys.KeyRing.digest(key))
    return json_response(key_out(info) | {"key": key}, 201)


@router.get("/keys", summary="List API keys (never the keys themselves)", dependencies=[REQUIRE_ADMIN], response_model=list[KeyOut])
async def list_keys(request: Request) -> Response:
    infos = await run_in_threadpool(keys.list_keys, services_of(request).sessions)
    return json_response([key_out(info) for info in infos])


@router.delete(
    "/keys/{key_id}", summary="Revoke an API key", dependencies=[REQUIRE_ADMIN], response_model=KeyOut, responses={404: {}}
)
async def revoke_key(request: Request, key_id: Annotated[str, Path(max_length=16)]) -> Response:
    services = services_of(request)
    try:
        info = await run_in_threadpool(keys.revoke_key, services.sessions, key_id)
    except KeyNotFound:
        raise Problem(404, f"no API key with id {key_id!r}") from None
    services.keyring.note(info)
    return json_response(key_out(info))
