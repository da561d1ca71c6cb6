"""create_app(): the FastAPI application factory."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from . import __version__
from .api import calibrate, calibrators, health, problems
from .api.bodies import BodySizeLimit
from .api.state import Services
from .config import Settings, get_settings
from .storage.cache import CalibratorStore
from .storage.db import make_engine, make_sessionmaker

logger = logging.getLogger("calibd")


async def _poll_registry(store: CalibratorStore, seconds: float) -> None:
    """Pick up promotions made by other processes; keep serving if the database is away."""
    while True:
        try:
            await run_in_threadpool(store.refresh)
        except Exception as error:  # the database may be restarting; try again next tick
            logger.warning("registry poll failed: %s", error)
        await asyncio.sleep(seconds)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.database_url)
        sessions = make_sessionmaker(engine)
        store = CalibratorStore(sessions, settings.calibrator_cache_bytes)
        app.state.services = Services(settings=settings, engine=engine, sessions=sessions, store=store)
        poller = asyncio.create_task(_poll_registry(store, settings.version_poll_seconds))
        try:
            yield
        finally:
            poller.cancel()
            engine.dispose()

    app = FastAPI(
        title="calibd",
        version=__version__,
        summary="Fit, store and serve calibrators for classifier scores.",
        lifespan=lifespan,
    )
    problems.install(app)
    for module in (calibrators, calibrate, health):
        app.include_router(module.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
