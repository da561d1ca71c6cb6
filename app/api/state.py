"""What the routers share: settings, the database, the caches and the fit workers."""

from __future__ import annotations

from dataclasses import dataclass
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


def services(request: Request) -> Services:
    return request.app.state.services
