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

import contextlib
import email.utils
import functools
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx
import numpy as np
import orjson

from . import __version__

DEFAULT_URL = "http://127.0.0.1:8000"

#: ``format`` and ``format_version`` of an exported calibrator (see app/api/transfer.py).
EXPORT_FORMAT = "calibd-calibrator"
EXPORT_FORMAT_VERSION = 1

__all__ = [
    "AsyncClient",
    "BadRequest",
    "CalibdError",
    "Calibration",
    "CalibratorVersion",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Evaluation",
    "FeedbackReceipt",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
]


# -- errors -----------------------------------------------------------------------------------


class CalibdError(Exception):
    """An error answer from calibd, with its RFC 9457 problem details.

    ``status`` (int), ``title``, ``detail``, ``errors`` (a list of
    ``{"pointer": ..., "detail": ...}`` into the request), ``type`` and
    ``problem``, the whole problem document.
    """

    status: int | None = None

    def __init__(
        self,
        status: int | None,
        title: str,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        problem: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.problem = problem or {}
        self.type = self.problem.get("type")
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.status} {self.title}" if self.status else self.title
        return f"{head}: {self.detail}" if self.detail else head


class BadRequest(CalibdError):
    """400: the body is not JSON, or not a JSON object."""


class Unauthorized(CalibdError):
    """401: no API key, or an unknown, expired or revoked one (set CALIBD_API_KEY)."""


class Forbidden(CalibdError):
    """403: the API key lacks the scope the call needs."""


class NotFound(CalibdError):
    """404: no such calibrator, version, key or route."""


class Conflict(CalibdError):
    """409: for instance a calibrator with no current version."""


class PayloadTooLarge(CalibdError):
    """413: the body is over the service's CALIBD_MAX_BODY_BYTES."""


class UnsupportedMediaType(CalibdError):
    """415: wrong Content-Type."""


class InvalidInput(CalibdError):
    """422: invalid values; ``errors`` point into the request (``/holdout/scores/3``)."""


class ServerError(CalibdError):
    """500 and other 5xx answers but 503."""


class Unavailable(CalibdError):
    """503: the service or its database is unavailable, or a fit ran past its time limit."""


class ConnectionFailed(Unavailable):
    """calibd could not be reached, or the connection broke (``status`` is None)."""


ERRORS: dict[int, type[CalibdError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: InvalidInput,
    503: Unavailable,
}


def error_from_problem(status: int, problem: Mapping[str, Any], retry_after: float | None = None) -> CalibdError:
    """The typed error of a problem-details document."""
    kind = ERRORS.get(status, ServerError if status >= 500 else CalibdError)
    title = problem.get("title") or _phrase(status)
    return kind(status, str(title), str(problem.get("detail") or ""), list(problem.get("errors") or []), dict(problem), retry_after)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _error_from_response(response: httpx.Response) -> CalibdError:
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):  # not calibd's answer (a proxy's page, say)
        text = " ".join(response.text.split())[:200]
        problem = {"title": _phrase(response.status_code), "status": response.status_code, "detail": text}
    return error_from_problem(response.status_code, problem, retry_after)


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibratorVersion:
    """A stored version, as a fit or an import answers: ``version`` and ``summary`` above all."""

    name: str
    version: int
    current: bool
    method: str
    n_samples: int
    summary: dict[str, Any] = field(repr=False)
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibratorVersion:
        return cls(data["name"], data["version"], data["current"], data["method"], data["n_samples"], data.get("summary") or {}, data)

    def __repr__(self) -> str:
        chosen = f", chose={self.chosen!r}" if self.chosen else ""

        def rounded(metrics: dict[str, Any]) -> dict[str, Any]:
            return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}

        return (
            f"CalibratorVersion(name={self.name!r}, version={self.version}, current={self.current}, "
            f"method={self.method!r}{chosen}, n_samples={self.n_samples}, "
            f"before={rounded(self.before)}, after={rounded(self.after)})"
        )

    @property
    def chosen(self) -> str | None:
        """The method ``auto`` chose, if this is an ``auto`` fit."""
        return (self.summary.get("fit") or {}).get("chosen")

    @property
    def before(self) -> dict[str, float]:
        """Metrics of the raw holdout scores (``ece``, ``brier``, ``log_loss``)."""
        return self.summary.get("before", {})

    @property
    def after(self) -> dict[str, float]:
        """Metrics of the calibrated holdout, cross-fitted (never scored by a calibrator that saw the row)."""
        return self.summary.get("after", {})


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` returns: ``probabilities`` (numpy), the ``version`` that made them, and
    per-row ``extras`` (``intervals``, ``accepted``, ``decisions``...), also readable as attributes."""

    calibrator: str
    version: int
    probabilities: np.ndarray
    extras: dict[str, Any] = field(default_factory=dict)
    #: The class of each column (binary: of class 1 at index 1), when the calibrator was fitted on class names.
    classes: list[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or extra {name!r}")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.probabilities if dtype is None else self.probabilities.astype(dtype)

    def __len__(self) -> int:
        return len(self.probabilities)


@dataclass(frozen=True)
class FeedbackReceipt:
    count: int
    unknown_ids: list[str]
    expired_ids: list[str]
    #: The Idempotency-Key sent (one per call, reused by its retries).
    idempotency_key: str
    #: True when the service had already recorded this request (a retry), and answered from its record.
    replayed: bool = False
    #: Labels stored to wait for a prediction not logged yet (their ids are ``unknown_ids``); joined when it is.
    pending: int = 0
    #: Ids labelled before (the first label wins) or repeated in the call: not recorded again.
    duplicate_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Evaluation:
    """``metrics``: name -> {"value", "ci", "params", ...}; ``reliability``: the diagram's bins."""

    metrics: dict[str, dict[str, Any]]
    reliability: dict[str, Any]

    @property
    def values(self) -> dict[str, float | None]:
        return {name: metric["value"] for name, metric in self.metrics.items()}


# -- requests, without I/O ----------------------------------------------------------------------


@dataclass
class _Call:
    """One HTTP request an operation needs."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    files: Callable[[], dict[str, Any]] | None = None  # opened afresh for every attempt
    data: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Safe to send again after it may have arrived (retried on broken connections and 503).
    idempotent: bool = True
    #: "json", "bytes", "text" or "none": how to read a successful answer.
    expect: str = "json"
    long: bool = False  # a fit: the read timeout is fit_timeout

    def content(self) -> bytes | None:
        return None if self.json is None else orjson.dumps(self.json, option=orjson.OPT_SERIALIZE_NUMPY)


@dataclass(frozen=True)
class _Reply:
    status: int
    headers: httpx.Headers
    body: Any


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Item:
    value: Any


@dataclass(frozen=True)
class _Attempt:
    """Send ``call`` once; the client answers with the ``httpx.Response``, or the
    ``httpx.TransportError`` it raised."""

    call: _Call


Operation = Generator[Any, Any, Any]


def _operation(func: Callable[..., Operation]) -> Callable[..., Operation]:
    """Mark a generator method as an API call; each client wraps it to send its requests."""
    func._calibd_operation = "call"  # type: ignore[attr-defined]
    return func


def _iteration(func: Callable[..., Operation]) -> Callable[..., Operation]:
    """Mark a generator method that yields items (``_Item``) to its caller, such as a paged list."""
    func._calibd_operation = "iterate"  # type: ignore[attr-defined]
    return func


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max((when - datetime.now(timezone.utc)).total_seconds(), 0.0)


#: Transport errors raised before any of the request was sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: ``retries`` more attempts at most, waiting ``Retry-After`` when the
    service says (capped at ``max_delay``), else ``backoff`` x 2^attempt with jitter."""

    retries: int = 3
    backoff: float = 0.5
    max_delay: float = 30.0

    def wait(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1`` (0-based), or None: give up."""
        if attempt >= self.retries:
            return None
        if retry_after is not None:
            return min(retry_after, self.max_delay)
        return min(self.backoff * 2**attempt * (0.5 + random.random() / 2), self.max_delay)

    def after_error(self, call: _Call, error: httpx.TransportError, attempt: int) -> float | None:
        # A connection that was never made carried nothing: any call may go again.
        if isinstance(error, _NOT_SENT) or call.idempotent:
            return self.wait(attempt, None)
        return None

    def after_response(self, call: _Call, response: httpx.Response, attempt: int) -> float | None:
        if response.status_code != 503 or not call.idempotent:
            return None
        return self.wait(attempt, parse_retry_after(response.headers.get("Retry-After")))


def _decode(call: _Call, response: httpx.Response) -> _Reply:
    if response.status_code >= 400:
        raise _error_from_response(response)
    if call.expect == "none" or response.status_code == 204:
        body: Any = None
    elif call.expect == "bytes":
        body = response.content
    elif call.expect == "text":
        body = response.text
    else:
        body = orjson.loads(response.content)
    return _Reply(response.status_code, response.headers, body)


def _connection_failed(url: str, error: httpx.TransportError) -> ConnectionFailed:
    reason = str(error) or type(error).__name__
    what = "cannot reach" if isinstance(error, _NOT_SENT) else "lost the connection to"
    return ConnectionFailed(None, "Connection failed", f"{what} {url}: {reason}")


def _jsonable(value: Any) -> Any:
    """Arrays as orjson serialises them fast (numeric, contiguous), anything else as lists.

    orjson writes NaN and infinity as null; the service would then only say that an array
    holds something other than numbers. Such arrays are written with NaN/Infinity literals
    instead, which the service parses in order to point at the element (``/scores/3``).
    """
    if value is None or isinstance(value, (str, bytes, int, float, bool, dict)):
        return value
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind in "biuf" and array.dtype.byteorder in "=|<" and array.dtype.itemsize <= 8:
        if array.dtype.kind == "f":
            if array.dtype != np.float64 and array.dtype != np.float32:
                array = array.astype(np.float64)
            if not np.isfinite(array).all():
                return orjson.Fragment(json.dumps(array.tolist()))
        return np.ascontiguousarray(array)
    return array.tolist()


def _arrays(values: dict[str, Any]) -> dict[str, Any]:
    return {key: _jsonable(value) for key, value in values.items()}


def _name(name: str) -> str:
    return quote(str(name), safe="")


#: Content types of uploaded holdout files, by suffix (the service also knows them by their first bytes).
_UPLOAD_TYPES = {".npz": "application/octet-stream", ".parquet": "application/vnd.apache.parquet"}


class _Reader:
    """A file whose reads are reported (upload progress); httpx still sees its size and can rewind it."""

    def __init__(self, file: BinaryIO, total: int, report: Callable[[int, int], None] | None):
        self._file = file
        self._total = total
        self._report = report
        self._sent = 0

    def fileno(self) -> int:
        return self._file.fileno()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        position = self._file.seek(offset, whence)
        if whence == 0 and offset == 0:
            self._sent = 0
        return position

    def close(self) -> None:
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._sent += len(chunk)
        if self._report is not None and chunk:
            self._report(self._sent, self._total)
        return chunk


#: Called with (stage, fraction done or None, seconds left or None). Stages: "upload" (per chunk
#: sent), "fit" (uploaded; the synchronous fit runs), and a fit job's states ("queued", "running").
Progress = Callable[[str, float | None, float | None], None]


class _API:
    """Every API call, once. Subclasses say how requests are sent (blocking or async)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        fit_timeout: float | None = 900.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_retry_delay: float = 30.0,
        job_poll_seconds: float = 0.5,
    ):
        self.url = (url or os.environ.get("CALIBD_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("CALIBD_API_KEY") or None
        self.headers = {"User-Agent": f"calibd-client/{__version__}"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self.fit_timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0), read=fit_timeout)
        self.retry = RetryPolicy(retries, backoff, max_retry_delay)
        self.job_poll_seconds = job_poll_seconds

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attribute, func in vars(_API).items():
            kind = getattr(func, "_calibd_operation", None)
            if kind is not None and attribute not in vars(cls):
                setattr(cls, attribute, cls._wrap(func, kind))

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        raise NotImplementedError

    @contextlib.contextmanager
    def _request(self, call: _Call) -> Iterator[dict[str, Any]]:
        """The arguments of ``httpx.request`` for one attempt at ``call`` (files opened afresh, then closed)."""
        files = call.files() if call.files else None
        headers = call.headers | ({"Content-Type": "application/json"} if call.json is not None else {})
        try:
            yield {
                "method": call.method, "url": call.path, "params": call.params, "content": call.content(),
                "data": call.data, "files": files, "headers": headers,
                "timeout": self.fit_timeout if call.long else self.timeout,
            }
        finally:
            for _filename, file, *_ in (files or {}).values():
                file.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- sending, with retries (one loop for both clients) ------------------------------------------
    def _sent(self, operation: Operation) -> Operation:
        """``operation`` with each request it makes sent under the retry policy. Yields what a client
        does for it: ``_Attempt`` (one HTTP request), ``_Sleep`` and ``_Item``."""
        reply = None
        while True:
            try:
                step = operation.send(reply)
            except StopIteration as done:
                return done.value
            reply = (yield from self._attempts(step)) if isinstance(step, _Call) else (yield step)

    def _attempts(self, call: _Call) -> Operation:
        """Attempts at ``call`` until one is answered, or another may not be made."""
        attempt = 0
        while True:
            outcome = yield _Attempt(call)
            if isinstance(outcome, httpx.TransportError):
                wait = self.retry.after_error(call, outcome, attempt)
                if wait is None:
                    raise _connection_failed(self.url, outcome) from outcome
            else:
                wait = self.retry.after_response(call, outcome, attempt)
                if wait is None:
                    return _decode(call, outcome)
            attempt += 1
            yield _Sleep(wait)

    # -- fitting ---------------------------------------------------------------------------------
    @_operation
    def fit(
        self,
        name: str,
        scores: Any,
        labels: Any,
        method: str = "auto",
        input: str = "probability",
        options: dict[str, Any] | None = None,
        sample_weight: Any = None,
        promote: bool = True,
        classes: list[Any] | None = None,
        job: bool = False,
        progress: Progress | None = None,
        segments: dict[str, Any] | None = None,
        predictor: dict[str, Any] | None = None,
        **arrays: Any,
    ) -> Operation:
        """Fit a calibrator on a labelled holdout and store it as the next version of ``name``.

        ``scores``: (n,) for binary, (n, K) for multiclass; ``labels``: 0/1, 0..K-1 or class names;
        ``arrays``: a method's extra arrays (``features=...``). ``segments`` (``{"dimensions": [...]}``)
        and ``predictor`` (``{"url": ...}``), when given, replace the calibrator's with the version.
        ``job=True`` asks for an asynchronous fit job and waits for it where the service runs jobs.
        Returns the stored version (``.version``, ``.summary``, ``.before``, ``.after``). Never
        retried once sent.
        """
        holdout = _arrays({"scores": scores, "labels": labels, **arrays})
        if sample_weight is not None:
            holdout["sample_weight"] = _jsonable(sample_weight)
        if classes is not None:
            holdout["classes"] = list(classes)
        body = {"name": name, "method": method, "input": input, "options": options or {}, "promote": promote, "holdout": holdout}
        body |= {key: value for key, value in (("segments", segments), ("predictor", predictor)) if value is not None}
        call = _Call("POST", "/calibrators", json=body, idempotent=False, long=True)
        return (yield from self._fitting(call, job, progress))

    @_operation
    def fit_file(
        self,
        name: str,
        path: str | os.PathLike[str],
        method: str = "auto",
        input: str = "probability",
        options: dict[str, Any] | None = None,
        promote: bool = True,
        job: bool = False,
        progress: Progress | None = None,
    ) -> Operation:
        """Fit from a holdout file, uploaded as it is: a CSV with a header row (``label``, then
        ``score`` or ``score_0``...``score_{K-1}``, optionally ``weight``), a Parquet file
        (``.parquet``) with the same columns, or an ``.npz`` archive.

        ``progress`` hears of the upload and the fit (see ``Progress``).
        """
        path = Path(path)
        total = path.stat().st_size
        fields = {"name": name, "method": method, "input": input, "promote": "true" if promote else "false"}
        if options:
            fields["options"] = orjson.dumps(options).decode()

        def report(sent: int, size: int) -> None:
            if progress is not None:
                progress("upload", sent / size if size else 1.0, None)
                if sent >= size:
                    progress("fit", None, None)

        def files() -> dict[str, Any]:
            kind = _UPLOAD_TYPES.get(path.suffix.lower(), "text/csv")
            return {"file": (path.name, _Reader(path.open("rb"), total, report), kind)}

        call = _Call("POST", "/calibrators", files=files, data=fields, idempotent=False, long=True)
        return (yield from self._fitting(call, job, progress))

    def _fitting(self, call: _Call, job: bool, progress: Progress | None) -> Operation:
        # The whole summary (every metric and reliability bin), not the brief answer.
        call.params = {"detail": "full"} | ({"async": "true"} if job else {})
        if progress is not None and call.files is None:
            progress("fit", None, None)
        reply = yield call
        if reply.status != 202:
            return CalibratorVersion.from_json(reply.body)
        # An asynchronous fit: follow the job until it ends.
        location = reply.headers.get("Location") or f"/jobs/{reply.body['id']}"
        state = reply.body
        while True:
            status = state.get("state")
            if status == "succeeded":
                return CalibratorVersion.from_json(state["result"])
            if status == "failed":
                problem = state.get("problem") or {}
                raise error_from_problem(int(problem.get("status") or 500), problem)
            if progress is not None:
                progress(str(status), state.get("progress"), state.get("eta_seconds"))
            yield _Sleep(self.job_poll_seconds)
            state = (yield _Call("GET", _path_of(location, self.url))).body

    @_operation
    def job(self, job_id: str) -> Operation:
        """An asynchronous fit: ``state`` (queued, running, succeeded, failed), ``progress``,
        ``eta_seconds``, and the ``result`` or the ``problem``."""
        return (yield _Call("GET", f"/jobs/{_name(job_id)}")).body

    # -- calibrating and feedback ----------------------------------------------------------------
    @_operation
    def calibrate(
        self,
        name: str,
        scores: Any,
        version: int | None = None,
        ids: list[str] | None = None,
        costs: Any = None,
        **arrays: Any,
    ) -> Operation:
        """Calibrated probabilities of ``scores`` (binary: of class 1, (n,); multiclass: (n, K)).

        ``version=None`` is the current version. ``ids`` log the predictions so that feedback can
        name them later. ``costs`` (binary: ``{"false_positive": a, "false_negative": b}``;
        multiclass: a K x K matrix) adds the ``decisions`` of least expected cost. ``arrays`` are a
        method's extra arrays (``features=...``). Returns a ``Calibration``.
        """
        body = {"calibrator": name, "version": version, "scores": _jsonable(scores), **_arrays(arrays)}
        if ids is not None:
            body["ids"] = [str(i) for i in ids]
        if costs is not None:
            body["costs"] = costs if isinstance(costs, dict) else _jsonable(costs)
        data = dict((yield _Call("POST", "/calibrate", json=body)).body)
        probabilities = np.asarray(data.pop("probabilities"), dtype=np.float64)
        calibrator, served, classes = data.pop("calibrator"), data.pop("version"), data.pop("classes", None)
        extras = {key: np.asarray(value) if isinstance(value, list) else value for key, value in data.items()}
        return Calibration(calibrator, served, probabilities, extras, classes)

    @_operation
    def feedback(
        self,
        name: str,
        labels: Any,
        ids: list[str] | None = None,
        probabilities: Any = None,
        version: int | None = None,
        accepted: Any = None,
        idempotency_key: str | None = None,
    ) -> Operation:
        """Record labels: for predictions logged under ``ids``, or for labelled ``probabilities``
        (of ``version``, default current). One Idempotency-Key (uuid4 unless given) covers the
        call and its retries, so a retried call is counted once."""
        body: dict[str, Any] = {"calibrator": name, "labels": _jsonable(labels)}
        if ids is not None:
            body["ids"] = [str(i) for i in ids]
        if probabilities is not None:
            body["probabilities"] = _jsonable(probabilities)
        if version is not None:
            body["version"] = version
        if accepted is not None:
            body["accepted"] = [bool(a) for a in np.asarray(accepted).tolist()]
        key = idempotency_key or str(uuid.uuid4())
        reply = yield _Call("POST", "/feedback", json=body, headers={"Idempotency-Key": key})
        data = reply.body
        replayed = reply.headers.get("Idempotent-Replayed", "").lower() == "true"
        return FeedbackReceipt(
            data["count"], data["unknown_ids"], data["expired_ids"], key, replayed,
            pending=data.get("pending", 0), duplicate_ids=data.get("duplicate_ids", []),
        )

    @_operation
    def evaluate(
        self,
        probabilities: Any,
        labels: Any,
        sample_weight: Any = None,
        metrics: list[str] | None = None,
        options: dict[str, Any] | None = None,
    ) -> Operation:
        """Calibration metrics of probabilities against labels (stores nothing). ``options``:
        ``n_bins``, ``binning``, ``norm``, ``target``, ``lambda``, ``bootstrap``, as /evaluate."""
        body: dict[str, Any] = {"probabilities": _jsonable(probabilities), "labels": _jsonable(labels)}
        if sample_weight is not None:
            body["sample_weight"] = _jsonable(sample_weight)
        if metrics is not None:
            body["metrics"] = list(metrics)
        if options is not None:
            body["options"] = options
        data = (yield _Call("POST", "/evaluate", json=body)).body
        return Evaluation(data["metrics"], data["reliability"])

    # -- the registry --------------------------------------------------------------------------
    @_iteration
    def calibrators(self, page_size: int = 100) -> Operation:
        """Every calibrator (name, current and latest version, method...), fetching page after page."""
        cursor = None
        while True:
            params = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = (yield _Call("GET", "/calibrators", params=params)).body
            for item in page["items"]:
                yield _Item(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    @_operation
    def calibrator(self, name: str) -> Operation:
        """A calibrator: its latest version's details and the list of its versions."""
        return (yield _Call("GET", f"/calibrators/{_name(name)}")).body

    @_operation
    def version(self, name: str, version: int) -> Operation:
        """One version: its fit summary and its parameters."""
        return (yield _Call("GET", f"/calibrators/{_name(name)}/versions/{int(version)}")).body

    @_operation
    def promote(self, name: str, version: int) -> Operation:
        """Make ``version`` current: pin it, or roll back."""
        return (yield _Call("POST", f"/calibrators/{_name(name)}/promote", json={"version": int(version)}, idempotent=False)).body

    @_operation
    def delete(self, name: str) -> Operation:
        """Delete the calibrator, all its versions and its feedback."""
        yield _Call("DELETE", f"/calibrators/{_name(name)}", expect="none", idempotent=False)

    @_operation
    def set_labels(self, name: str, window: str | float | None, missing: str = "negative") -> Operation:
        """Declare how the calibrator's labels arrive: ``window`` ("30s", "6h", "7d"; None: final on arrival)
        and what a prediction without a label is when its window ends (``"negative"`` or ``"unlabelled"``)."""
        body = {"window": window, "missing": missing}
        return (yield _Call("PUT", f"/calibrators/{_name(name)}/labels", json=body)).body

    @_operation
    def monitor(self, name: str, version: int | None = None) -> Operation:
        """The feedback windows' metrics and the drift alarm of a version (default current)."""
        params = {"version": version} if version is not None else None
        return (yield _Call("GET", f"/calibrators/{_name(name)}/monitor", params=params)).body

    @_operation
    def report(self, name: str, format: str = "json", version: int | None = None, hours: int | None = None) -> Operation:
        """The report of a version: a dict (json), the diagram as PNG bytes or SVG text, or the HTML page."""
        params: dict[str, Any] = {"format": format}
        if version is not None:
            params["version"] = version
        if hours is not None:
            params["hours"] = hours
        expect = {"json": "json", "png": "bytes"}.get(format, "text")
        return (yield _Call("GET", f"/calibrators/{_name(name)}/report", params=params, expect=expect)).body

    # -- transformer mode --------------------------------------------------------------------
    @_operation
    def predictor(self, name: str) -> Operation:
        """The calibrator's stored predictor (``stored``, or None) and the one in effect
        (``effective``: url, model, output and its ``source``; None: /v2 infer requests need scores)."""
        return (yield _Call("GET", f"/calibrators/{_name(name)}/predictor")).body

    @_operation
    def set_predictor(self, name: str, url: str, model: str | None = None, output: str | None = None) -> Operation:
        """Store the model server the calibrator's /v2 infer requests without scores go to:
        ``http(s)://host:port`` or ``grpc://host:port``; ``model`` defaults to the calibrator's name,
        ``output`` (the one calibrated) to the server's CALIBD_PREDICTOR_OUTPUT."""
        body = {"url": url} | ({"model": model} if model is not None else {}) | ({"output": output} if output is not None else {})
        return (yield _Call("PUT", f"/calibrators/{_name(name)}/predictor", json=body)).body

    @_operation
    def delete_predictor(self, name: str) -> Operation:
        """Remove the calibrator's stored predictor (CALIBD_PREDICTORS and the server's default apply again)."""
        return (yield _Call("DELETE", f"/calibrators/{_name(name)}/predictor")).body

    # -- portable calibrators ------------------------------------------------------------------
    @_operation
    def export(self, name: str, version: int | None = None) -> Operation:
        """A stored version as portable JSON (default: the current version, else the latest).

        ``calibd.calibration.from_dict(export["parameters"])`` rebuilds the calibrator offline, and
        gives the outputs the service gives; ``import_calibrator`` stores it in any calibd.
        """
        if version is None:
            info = (yield _Call("GET", f"/calibrators/{_name(name)}")).body
            version = info["current_version"] or info["latest_version"]
        stored = (yield _Call("GET", f"/calibrators/{_name(name)}/versions/{int(version)}")).body
        return {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "calibd_version": __version__,
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **{key: stored[key] for key in ("name", "version", "created_at", "method", "input", "n_classes", "classes",
                                             "n_samples", "holdout_sha256", "fit_seconds", "summary", "parameters")},
        }

    @_operation
    def import_calibrator(self, data: Mapping[str, Any], name: str | None = None, promote: bool = True) -> Operation:
        """Store an export as the next version of ``name`` (default: the name it was exported
        from), without refitting; the service checks that its parameters load. Never retried once sent."""
        target = name or data.get("name")
        if not target:
            raise ValueError("the export names no calibrator: pass name=")
        call = _Call(
            "POST", f"/calibrators/{_name(target)}/import", params={"promote": "true" if promote else "false"},
            json=dict(data), idempotent=False,
        )
        return CalibratorVersion.from_json((yield call).body)

    # -- API keys (admin) ----------------------------------------------------------------------
    @_operation
    def create_key(self, scopes: list[str], expires_in_days: float | None = None, description: str = "") -> Operation:
        """Create an API key; the answer's ``key`` is shown this once."""
        body = {"scopes": list(scopes), "expires_in_days": expires_in_days, "description": description}
        return (yield _Call("POST", "/keys", json=body, idempotent=False)).body

    @_operation
    def keys(self) -> Operation:
        """Every API key's id, scopes and dates (never the keys themselves)."""
        return (yield _Call("GET", "/keys")).body

    @_operation
    def revoke_key(self, key_id: str) -> Operation:
        yield _Call("DELETE", f"/keys/{_name(key_id)}", expect="none")


def _path_of(location: str, base: str) -> str:
    """A Location header as a path on the client's base URL."""
    if location.startswith(base):
        return location[len(base):] or "/"
    return location if location.startswith("/") else httpx.URL(location).raw_path.decode()


class Client(_API):
    """A blocking client. Use as a context manager, or call ``close()``.

    ``url`` defaults to CALIBD_URL (else http://127.0.0.1:8000), ``api_key`` to CALIBD_API_KEY.
    ``timeout`` is in seconds; fits may take up to ``fit_timeout``. ``retries``, ``backoff`` and
    ``max_retry_delay`` bound the safe retries described in the module docstring.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0, **options: Any):
        super().__init__(url, api_key, timeout, **options)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _attempt(self, call: _Call) -> httpx.Response | httpx.TransportError:
        try:
            with self._request(call) as request:
                return self.http.request(**request)
        except httpx.TransportError as error:
            return error

    def _drive(self, operation: Operation) -> Iterator[Any]:
        steps = self._sent(operation)
        answer = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = None
            if isinstance(step, _Attempt):
                answer = self._attempt(step.call)
            elif isinstance(step, _Sleep):
                time.sleep(step.seconds)
            else:
                yield step.value

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        if kind == "iterate":

            @functools.wraps(func)
            def iterate(self: Client, *args: Any, **kwargs: Any) -> Iterator[Any]:
                yield from self._drive(func(self, *args, **kwargs))

            return iterate

        @functools.wraps(func)
        def call(self: Client, *args: Any, **kwargs: Any) -> Any:
            steps = self._drive(func(self, *args, **kwargs))
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            raise RuntimeError(f"{func.__name__} yielded items")  # pragma: no cover

        return call


class AsyncClient(_API):
    """The same methods as ``Client``, as coroutines; ``calibrators()`` is an async iterator.

    Use as ``async with AsyncClient() as calibd:``, or call ``await aclose()``.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 60.0, **options: Any):
        super().__init__(url, api_key, timeout, **options)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _attempt(self, call: _Call) -> httpx.Response | httpx.TransportError:
        try:
            with self._request(call) as request:
                return await self.http.request(**request)
        except httpx.TransportError as error:
            return error

    async def _drive(self, operation: Operation, results: list[Any]) -> AsyncIterator[Any]:
        import asyncio

        steps = self._sent(operation)
        answer = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                results.append(done.value)
                return
            answer = None
            if isinstance(step, _Attempt):
                answer = await self._attempt(step.call)
            elif isinstance(step, _Sleep):
                await asyncio.sleep(step.seconds)
            else:
                yield step.value

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        if kind == "iterate":

            @functools.wraps(func)
            async def iterate(self: AsyncClient, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async for item in self._drive(func(self, *args, **kwargs), []):
                    yield item

            return iterate

        @functools.wraps(func)
        async def call(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
            results: list[Any] = []
            async for _ in self._drive(func(self, *args, **kwargs), results):
                raise RuntimeError(f"{func.__name__} yielded items")  # pragma: no cover
            return results[0]

        return call

