"""The services container: what every service, route and background loop of one app shares
(settings, the database, the caches, the prediction log, the keys and the fit workers)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from ..config import Settings
from ..storage.cache import CalibratorStore
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
    #: Asynchronous fits this process is running, by job id.
    running_jobs: dict[str, asyncio.Task] = field(default_factory=dict)
    #: This app's identity as the owner of its fit jobs and recalibration leases: one per app,
    #: not per process, so that two apps served from one process (as tests and embedders do)
    #: exclude each other too.
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
