"""The services container: what every service, route and background loop of one app shares
(settings, the database, the caches, the prediction log, the keys and the fit workers)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from ..config import Settings
from ..storage.cache import CalibratorStore, LoadedCalibrator
from ..storage.keys import KeyRing
from ..storage.prediction_log import PredictionLog
from ..storage.repository import Sessions
from ..workers.pool import FitPool


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
    #: The /metrics monitor gauges' shared reader (api.observability.MonitorCollector).
    monitor_collector: Any = None
    #: A one-connection engine with short timeouts for readiness checks (None: ``engine``).
    probe_engine: Engine | None = None
    #: The last write the database refused for want of space or because it is read-only:
    #: (``"full"`` or ``"read-only"``, time.monotonic()); /readyz reports it for a while.
    storage_fault: tuple[str, float] | None = None
    #: Asynchronous fits this process is running, by job id.
    running_jobs: dict[str, asyncio.Task] = field(default_factory=dict)
    #: This app's identity as the owner of its fit jobs and recalibration leases: one per app,
    #: not per process, so that two apps served from one process (as tests and embedders do)
    #: exclude each other too.
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: POST /cloudevents' unpaired halves (services/cloudevents.py makes it on first use).
    cloudevents: Any = None

    async def calibrator(self, name: str, version: int | None) -> LoadedCalibrator:
        """The version to serve (None: the current one), from memory or (once) the database;
        NotFound and NoCurrentVersion propagate."""
        return self.store.get(name, version) or await run_in_threadpool(self.store.load, name, version)
