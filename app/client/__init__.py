"""A Python client for calibd: numpy arrays in, numpy arrays out.

    >>> from calibd.client import Client
    >>> calibd = Client()                  # CALIBD_URL and CALIBD_API_KEY, or Client(url, api_key)
    >>> fitted = calibd.fit("fraud-model", scores, labels, method="auto")
    >>> fitted.version, fitted.after["ece"]
    >>> calibd.calibrate("fraud-model", new_scores).probabilities     # a numpy array

``AsyncClient`` has the same methods, as coroutines (``calibrators()`` is an
async iterator there). Both are written once: every API call below is a
generator that yields the HTTP requests it needs and returns the result, and
the two clients differ only in how they send them.

Errors are ``CalibdError`` subclasses carrying the problem details the
service answered with (``status``, ``title``, ``detail``, ``errors``).

Retries are safe ones only. Calls that can be repeated without effect (GET,
``calibrate``, ``evaluate``, and ``feedback``, which sends an
``Idempotency-Key`` that the service uses to count a retried request once)
are retried on connection failures and on 503, honouring ``Retry-After``,
with exponential backoff and a bounded number of attempts. Fits, imports,
promotions and deletions are retried only when the connection could not be
made at all, so the request never left; never after it may have arrived.
"""

from __future__ import annotations

from .api import DEFAULT_URL, EXPORT_FORMAT, EXPORT_FORMAT_VERSION
from .asynchronous import AsyncClient
from .errors import BadRequest, CalibdError, Conflict, ConnectionFailed, Forbidden, InvalidInput, NotFound, PayloadTooLarge, ServerError, Unauthorized, Unavailable, UnsupportedMediaType, error_from_problem
from .results import Calibration, CalibratorVersion, Evaluation, FeedbackReceipt
from .sync import Client
from .transport import RetryPolicy, parse_retry_after

__all__ = [
    "AsyncClient",
    "BadRequest",
    "CalibdError",
    "Calibration",
    "CalibratorVersion",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "DEFAULT_URL",
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "error_from_problem",
    "Evaluation",
    "FeedbackReceipt",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "parse_retry_after",
    "PayloadTooLarge",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
]
