"""What the routers share: the services container of the app serving a request, and the calibrator to serve."""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ..services.container import Services
from ..storage.cache import LoadedCalibrator

__all__ = ["Services", "resolve_calibrator", "services"]


def services(request: Request) -> Services:
    return request.app.state.services


async def resolve_calibrator(services: Services, name: str, version: int | None) -> LoadedCalibrator:
    """The version to serve, from memory or (once) the database; NotFound and NoCurrentVersion propagate."""
    return services.store.get(name, version) or await run_in_threadpool(services.store.load, name, version)
