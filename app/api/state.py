"""What the routers share: settings, the database, the caches and the fit workers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

if TYPE_CHECKING:  # annotations only: importing these here would be circular
    from prometheus_client import CollectorRegistry
    from sqlalchemy import Engine

    from ..config import Settings
    from ..storage.cache import CalibratorStore
    from ..storage.keys import KeyRing
    from ..storage.prediction_log import PredictionLog
    from ..storage.repository import Sessions
    from .calibrators.fit_pool import FitPool


@dataclass
class Services:
    settings: Settings
    engine: Engine
    sessions: Sessions
    store: CalibratorStore
    prediction_log: PredictionLog
    metrics_registry: CollectorRegistry
    keyring: KeyRing
    fit_pool: FitPool
    #: Asynchronous fits this process is running, by job id.
    running_jobs: dict[str, asyncio.Task] = field(default_factory=dict)


def services(request: Request) -> Services:
    return request.app.state.services
