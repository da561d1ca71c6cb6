"""What the routers share: settings, the database, the caches and the fit workers."""

from __future__ import annotations

import asyncio
import uuid
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
    from .observability import MonitorCollector


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
    monitor_collector: MonitorCollector
    #: A one-connection engine with short timeouts for readiness checks.
    probe_engine: Engine
    #: Asynchronous fits this process is running, by job id.
    running_jobs: dict[str, asyncio.Task] = field(default_factory=dict)
    #: This app's identity as the owner of its fit jobs and recalibration leases: one per app,
    #: not per process, so that two apps served from one process (as tests and embedders do)
    #: exclude each other too.
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The last write the database refused for want of space or because it is read-only:
    #: (``"full"`` or ``"read-only"``, time.monotonic()); /readyz reports it for a while.
    storage_fault: tuple[str, float] | None = None


def services(request: Request) -> Services:
    return request.app.state.services
