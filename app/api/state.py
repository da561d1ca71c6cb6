"""What the routers share: settings, the database and the calibrator cache."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from ..config import Settings
from ..storage.cache import CalibratorStore
from ..storage.keys import KeyRing
from ..storage.prediction_log import PredictionLog
from ..storage.repository import Sessions


@dataclass
class Services:
    settings: Settings
    engine: Engine
    sessions: Sessions
    store: CalibratorStore
    prediction_log: PredictionLog
    metrics_registry: CollectorRegistry
    keyring: KeyRing


def services(request: Request) -> Services:
    return request.app.state.services
