"""Every API call of the client, written once as a generator of requests (see ``transport``)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from .. import __version__
from .encoding import Progress, ProgressReader, UPLOAD_TYPES, jsonable, jsonable_arrays, quoted_name
from .errors import error_from_problem
from .results import Calibration, CalibratorVersion, Evaluation, FeedbackReceipt
from .transport import Attempt, Call, Item, Operation, RetryPolicy, Sleep, api_call, api_iteration, connection_failed, decode

DEFAULT_URL = "http://127.0.0.1:8000"

#: ``format`` and ``format_version`` of an exported calibrator (see app/api/transfer.py).
EXPORT_FORMAT = "calibd-calibrator"
EXPORT_FORMAT_VERSION = 1

class API:
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
        for attribute, func in vars(API).items():
            kind = getattr(func, "_calibd_operation", None)
            if kind is not None and attribute not in vars(cls):
                setattr(cls, attribute, cls._wrap(func, kind))

    @classmethod
    def _wrap(cls, func: Callable[..., Operation], kind: str) -> Callable[..., Any]:
        raise NotImplementedError

    @contextlib.contextmanager
    def _request(self, call: Call) -> Iterator[dict[str, Any]]:
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
        does for it: ``Attempt`` (one HTTP request), ``Sleep`` and ``Item``."""
        reply = None
        while True:
            try:
                step = operation.send(reply)
            except StopIteration as done:
                return done.value
            reply = (yield from self._attempts(step)) if isinstance(step, Call) else (yield step)

    def _attempts(self, call: Call) -> Operation:
        """Attempts at ``call`` until one is answered, or another may not be made."""
        attempt = 0
        while True:
            outcome = yield Attempt(call)
            if isinstance(outcome, httpx.TransportError):
                wait = self.retry.after_error(call, outcome, attempt)
                if wait is None:
                    raise connection_failed(self.url, outcome) from outcome
            else:
                wait = self.retry.after_response(call, outcome, attempt)
                if wait is None:
                    return decode(call, outcome)
            attempt += 1
            yield Sleep(wait)

    # -- fitting ---------------------------------------------------------------------------------
    @api_call
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
        holdout = jsonable_arrays({"scores": scores, "labels": labels, **arrays})
        if sample_weight is not None:
            holdout["sample_weight"] = jsonable(sample_weight)
        if classes is not None:
            holdout["classes"] = list(classes)
        body = {"name": name, "method": method, "input": input, "options": options or {}, "promote": promote, "holdout": holdout}
        body |= {key: value for key, value in (("segments", segments), ("predictor", predictor)) if value is not None}
        call = Call("POST", "/calibrators", json=body, idempotent=False, long=True)
        return (yield from self._fitting(call, job, progress))

    @api_call
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
            kind = UPLOAD_TYPES.get(path.suffix.lower(), "text/csv")
            return {"file": (path.name, ProgressReader(path.open("rb"), total, report), kind)}

        call = Call("POST", "/calibrators", files=files, data=fields, idempotent=False, long=True)
        return (yield from self._fitting(call, job, progress))

    def _fitting(self, call: Call, job: bool, progress: Progress | None) -> Operation:
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
            yield Sleep(self.job_poll_seconds)
            state = (yield Call("GET", path_of(location, self.url))).body

    @api_call
    def job(self, job_id: str) -> Operation:
        """An asynchronous fit: ``state`` (queued, running, succeeded, failed), ``progress``,
        ``eta_seconds``, and the ``result`` or the ``problem``."""
        return (yield Call("GET", f"/jobs/{quoted_name(job_id)}")).body

    # -- calibrating and feedback ----------------------------------------------------------------
    @api_call
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
        body = {"calibrator": name, "version": version, "scores": jsonable(scores), **jsonable_arrays(arrays)}
        if ids is not None:
            body["ids"] = [str(i) for i in ids]
        if costs is not None:
            body["costs"] = costs if isinstance(costs, dict) else jsonable(costs)
        data = dict((yield Call("POST", "/calibrate", json=body)).body)
        probabilities = np.asarray(data.pop("probabilities"), dtype=np.float64)
        calibrator, served, classes = data.pop("calibrator"), data.pop("version"), data.pop("classes", None)
        extras = {key: np.asarray(value) if isinstance(value, list) else value for key, value in data.items()}
        return Calibration(calibrator, served, probabilities, extras, classes)

    @api_call
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
        body: dict[str, Any] = {"calibrator": name, "labels": jsonable(labels)}
        if ids is not None:
            body["ids"] = [str(i) for i in ids]
        if probabilities is not None:
            body["probabilities"] = jsonable(probabilities)
        if version is not None:
            body["version"] = version
        if accepted is not None:
            body["accepted"] = [bool(a) for a in np.asarray(accepted).tolist()]
        key = idempotency_key or str(uuid.uuid4())
        reply = yield Call("POST", "/feedback", json=body, headers={"Idempotency-Key": key})
        data = reply.body
        replayed = reply.headers.get("Idempotent-Replayed", "").lower() == "true"
        return FeedbackReceipt(
            data["count"], data["unknown_ids"], data["expired_ids"], key, replayed,
            pending=data.get("pending", 0), duplicate_ids=data.get("duplicate_ids", []),
        )

    @api_call
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
        body: dict[str, Any] = {"probabilities": jsonable(probabilities), "labels": jsonable(labels)}
        if sample_weight is not None:
            body["sample_weight"] = jsonable(sample_weight)
        if metrics is not None:
            body["metrics"] = list(metrics)
        if options is not None:
            body["options"] = options
        data = (yield Call("POST", "/evaluate", json=body)).body
        return Evaluation(data["metrics"], data["reliability"])

    # -- the registry --------------------------------------------------------------------------
    @api_iteration
    def calibrators(self, page_size: int = 100) -> Operation:
        """Every calibrator (name, current and latest version, method...), fetching page after page."""
        cursor = None
        while True:
            params = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = (yield Call("GET", "/calibrators", params=params)).body
            for item in page["items"]:
                yield Item(item)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    @api_call
    def calibrator(self, name: str) -> Operation:
        """A calibrator: its latest version's details and the list of its versions."""
        return (yield Call("GET", f"/calibrators/{quoted_name(name)}")).body

    @api_call
    def version(self, name: str, version: int) -> Operation:
        """One version: its fit summary and its parameters."""
        return (yield Call("GET", f"/calibrators/{quoted_name(name)}/versions/{int(version)}")).body

    @api_call
    def promote(self, name: str, version: int) -> Operation:
        """Make ``version`` current: pin it, or roll back."""
        return (yield Call("POST", f"/calibrators/{quoted_name(name)}/promote", json={"version": int(version)}, idempotent=False)).body

    @api_call
    def delete(self, name: str) -> Operation:
        """Delete the calibrator, all its versions and its feedback."""
        yield Call("DELETE", f"/calibrators/{quoted_name(name)}", expect="none", idempotent=False)

    @api_call
    def set_labels(self, name: str, window: str | float | None, missing: str = "negative") -> Operation:
        """Declare how the calibrator's labels arrive: ``window`` ("30s", "6h", "7d"; None: final on arrival)
        and what a prediction without a label is when its window ends (``"negative"`` or ``"unlabelled"``)."""
        body = {"window": window, "missing": missing}
        return (yield Call("PUT", f"/calibrators/{quoted_name(name)}/labels", json=body)).body

    @api_call
    def monitor(self, name: str, version: int | None = None) -> Operation:
        """The feedback windows' metrics and the drift alarm of a version (default current)."""
        params = {"version": version} if version is not None else None
        return (yield Call("GET", f"/calibrators/{quoted_name(name)}/monitor", params=params)).body

    @api_call
    def report(self, name: str, format: str = "json", version: int | None = None, hours: int | None = None) -> Operation:
        """The report of a version: a dict (json), the diagram as PNG bytes or SVG text, or the HTML page."""
        params: dict[str, Any] = {"format": format}
        if version is not None:
            params["version"] = version
        if hours is not None:
            params["hours"] = hours
        expect = {"json": "json", "png": "bytes"}.get(format, "text")
        return (yield Call("GET", f"/calibrators/{quoted_name(name)}/report", params=params, expect=expect)).body

    # -- transformer mode --------------------------------------------------------------------
    @api_call
    def predictor(self, name: str) -> Operation:
        """The calibrator's stored predictor (``stored``, or None) and the one in effect
        (``effective``: url, model, output and its ``source``; None: /v2 infer requests need scores)."""
        return (yield Call("GET", f"/calibrators/{quoted_name(name)}/predictor")).body

    @api_call
    def set_predictor(self, name: str, url: str, model: str | None = None, output: str | None = None) -> Operation:
        """Store the model server the calibrator's /v2 infer requests without scores go to:
        ``http(s)://host:port`` or ``grpc://host:port``; ``model`` defaults to the calibrator's name,
        ``output`` (the one calibrated) to the server's CALIBD_PREDICTOR_OUTPUT."""
        body = {"url": url} | ({"model": model} if model is not None else {}) | ({"output": output} if output is not None else {})
        return (yield Call("PUT", f"/calibrators/{quoted_name(name)}/predictor", json=body)).body

    @api_call
    def delete_predictor(self, name: str) -> Operation:
        """Remove the calibrator's stored predictor (CALIBD_PREDICTORS and the server's default apply again)."""
        return (yield Call("DELETE", f"/calibrators/{quoted_name(name)}/predictor")).body

    # -- portable calibrators ------------------------------------------------------------------
    @api_call
    def export(self, name: str, version: int | None = None) -> Operation:
        """A stored version as portable JSON (default: the current version, else the latest).

        ``calibd.calibration.from_dict(export["parameters"])`` rebuilds the calibrator offline, and
        gives the outputs the service gives; ``import_calibrator`` stores it in any calibd.
        """
        if version is None:
            info = (yield Call("GET", f"/calibrators/{quoted_name(name)}")).body
            version = info["current_version"] or info["latest_version"]
        stored = (yield Call("GET", f"/calibrators/{quoted_name(name)}/versions/{int(version)}")).body
        return {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "calibd_version": __version__,
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **{key: stored[key] for key in ("name", "version", "created_at", "method", "input", "n_classes", "classes",
                                             "n_samples", "holdout_sha256", "fit_seconds", "summary", "parameters")},
        }

    @api_call
    def import_calibrator(self, data: Mapping[str, Any], name: str | None = None, promote: bool = True) -> Operation:
        """Store an export as the next version of ``name`` (default: the name it was exported
        from), without refitting; the service checks that its parameters load. Never retried once sent."""
        target = name or data.get("name")
        if not target:
            raise ValueError("the export names no calibrator: pass name=")
        call = Call(
            "POST", f"/calibrators/{quoted_name(target)}/import", params={"promote": "true" if promote else "false"},
            json=dict(data), idempotent=False,
        )
        return CalibratorVersion.from_json((yield call).body)

    # -- API keys (admin) ----------------------------------------------------------------------
    @api_call
    def create_key(self, scopes: list[str], expires_in_days: float | None = None, description: str = "") -> Operation:
        """Create an API key; the answer's ``key`` is shown this once."""
        body = {"scopes": list(scopes), "expires_in_days": expires_in_days, "description": description}
        return (yield Call("POST", "/keys", json=body, idempotent=False)).body

    @api_call
    def keys(self) -> Operation:
        """Every API key's id, scopes and dates (never the keys themselves)."""
        return (yield Call("GET", "/keys")).body

    @api_call
    def revoke_key(self, key_id: str) -> Operation:
        yield Call("DELETE", f"/keys/{quoted_name(key_id)}", expect="none")


def path_of(location: str, base: str) -> str:
    """A Location header as a path on the client's base URL."""
    if location.startswith(base):
        return location[len(base):] or "/"
    return location if location.startswith("/") else httpx.URL(location).raw_path.decode()
