"""A calibrator's predictor (transformer mode): set, removed and read, with the allow-list applied
when it is set (a fit that names one goes through ``check_allowed`` too).

The URL's form was checked when the request was parsed (``config.PredictorSetting``); here it is
held against CALIBD_PREDICTOR_ALLOW, so that an admin key cannot point calibd at an address the
operator did not allow. The names it holds are checked again when a connection is made
(api/inference/keepalive.py, api/inference/transformer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..predictor_urls import PredictorUrlError, parse
from ..storage import predictors as predictor_store
from .errors import InvalidRequest

if TYPE_CHECKING:  # the container is built by the app; only its attributes are used here
    from .container import Services


def check_allowed(settings: Settings, value: dict[str, Any] | None, pointer: str = "/url") -> None:
    """Raise InvalidRequest at ``pointer`` if the predictor's URL is not allowed."""
    if value is None:
        return
    try:
        refusal = settings.allowed_predictors().refusal(parse(value["url"]))
    except PredictorUrlError as error:  # stored before the rules were tightened, or not through the API
        raise InvalidRequest(pointer, str(error)) from None
    if refusal is not None:
        raise InvalidRequest(pointer, refusal)


def set_predictor(services: Services, name: str, value: dict[str, Any] | None) -> None:
    """Store the calibrator's predictor (None: remove it) and serve it here at once. Raises
    InvalidRequest (a URL not allowed) before anything is written, or NotFound."""
    check_allowed(services.settings, value)
    predictor_store.set_predictor(services.sessions, name, value)
    services.store.set_predictor(name, value)


def get_predictor(services: Services, name: str) -> dict[str, Any] | None:
    """The calibrator's stored predictor, or None. Raises NotFound."""
    return predictor_store.get_predictor(services.sessions, name)
