"""/feedback: labels arrive after predictions; /calibrators/{name}/monitor: what they say."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, Header, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...calibration import CalibrationInputError
from ...calibration.base import as_float_array, check_scores, encode_labels
from ...calibration.columns import check_columns
from ...calibration.multicalibration import MulticalibrationCalibrator
from ...monitoring.segments import check_rows
from ...services import monitors
from ...storage import feedback as feedback_store
from ...storage import segments as segment_store
from ...storage.cache import LoadedCalibrator
from ...storage.feedback import DriftSettings, IdempotencyConflict, JoinCounts, LabelledBatch, StoredRequest, feature_rows
from ..bodies import parse_json_object, require_json
from ..calibrate.router import MAX_ID_LENGTH
from ..observability import FEEDBACK, FEEDBACK_DUPLICATES, FEEDBACK_UNMATCHED
from ..problems import Problem, input_error
from ..tables import feedback_request, read_table_request, table_body
from ..state import Services, services
from ..validation import MAX_VERSION, NamePath, json_response, request_body, validate
from .schemas import FeedbackReceipt, FeedbackRequest, FeedbackUpload, MonitorOut, UnmatchedLabelsOut
from ..auth import REQUIRE_FEEDBACK, REQUIRE_READ

router = APIRouter(tags=["feedback"])

IDEMPOTENCY_KEY = "/header/Idempotency-Key"


def count_joins(counts: JoinCounts) -> None:
    """Count what a background join did (labels that waited for their prediction)."""
    for name, n in counts.joined.items():
        if n:
            FEEDBACK.labels(name).inc(n)
    for name, n in counts.duplicates.items():
        if n:
            FEEDBACK_DUPLICATES.labels(name).inc(n)
    for name, n in counts.unmatched.items():
        if n:
            FEEDBACK_UNMATCHED.labels(name).inc(n)


def _digest(body: FeedbackRequest) -> str:
    """sha256 of what the request says (its fields, keys sorted), whatever the encoding: a multipart
    upload sent again has a new boundary, a JSON body sent again may have other spacing."""
    fields = {name: getattr(body, name) for name in FeedbackRequest.model_fields}
    try:
        text = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY, default=_plain)
    except orjson.JSONEncodeError:  # integers beyond 64 bits: the request is refused later, but hashed first
        text = json.dumps(fields, sort_keys=True, default=_plain).encode()
    return hashlib.sha256(text).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):  # the dtypes orjson leaves out (strings, objects)
        return value.tolist()
    raise TypeError(type(value).__name__)


def _replay(stored: StoredRequest, request_sha256: str | None) -> Response:
    if not stored.same_request(request_sha256):
        # IETF httpapi Idempotency-Key draft: a key reused with another payload is refused.
        raise Problem.invalid(IDEMPOTENCY_KEY, "this Idempotency-Key was used with a different request body; use a new key")
    return json_response(stored.response, 202, headers={"Idempotent-Replayed": "true"})


async def resolve(app: Services, name: str, version: int | None) -> LoadedCalibrator:
    return app.store.get(name, version) or await run_in_threadpool(app.store.load, name, version)


def _check_ids(ids: list, n: int, against: str = "labels") -> list[str]:
    for position, value in enumerate(ids):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH or "\x00" in value:
            raise Problem.invalid(f"/ids/{position}", f"ids are non-empty strings of at most {MAX_ID_LENGTH} characters, without NUL")
    if len(ids) != n:
        if against == "labels":
            raise Problem.invalid("/labels", f"has {n} entries but ids has {len(ids)}")
        raise Problem.invalid("/ids", f"has {len(ids)} entries but {against} has {n}")
    return ids


def _check_flags(values: list, n: int) -> np.ndarray:
    for position, value in enumerate(values):
        if not isinstance(value, bool):
            raise Problem.invalid(f"/accepted/{position}", "must be true or false")
    if len(values) != n:
        raise Problem.invalid("/accepted", f"has {len(values)} entries but probabilities has {n}")
    return np.array(values, dtype=bool)


def _check_features(loaded: LoadedCalibrator, value: object, n: int) -> list[dict]:
    """Features sent with self-contained rows, checked as /calibrate checks them for this version
    (the columns and kinds it was fitted on), as one {column: value} per row."""
    spec = loaded.calibrator.predict_arrays.get("features")
    if spec is None or not spec.columns:
        raise CalibrationInputError(
            "features", "this version takes no named features (multicalibration, or auto fitted with features, does)"
        )
    columns = check_columns(value, "features", n)
    fitted = getattr(loaded.calibrator, "calibrator_", loaded.calibrator)  # auto: the method it chose
    if isinstance(fitted, MulticalibrationCalibrator):
        fitted._check_features(columns, fitted.model_["features"])  # what its predict checks
    return feature_rows(columns)


@router.post(
    "/feedback",
    dependencies=[REQUIRE_FEEDBACK],
    status_code=202,
    summary="Record labels for logged predictions, or labelled probabilities",
    openapi_extra=table_body(request_body(("application/json", FeedbackRequest), ("multipart/form-data", FeedbackUpload))),
    responses={202: {"model": FeedbackReceipt}, 404: {}, 409: {}, 413: {}, 415: {}, 422: {}},
)
async def record_feedback(
    request: Request,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    calibrator: Annotated[str | None, Query(description="with an Arrow IPC stream body: the calibrator", max_length=200)] = None,
    version: Annotated[int | None, Query(ge=1, le=MAX_VERSION, description="with an Arrow IPC stream body: the version")] = None,
) -> Response:
    table = await read_table_request(request)
    if table is None:
        require_json(request.headers)
        body = validate(FeedbackRequest, parse_json_object(await request.body()))
        locate = lambda error: input_error(error, ())  # noqa: E731
    else:
        body, locate = feedback_request(*table)
    app = services(request)
    if body.ids is None and body.probabilities is None:
        raise Problem.invalid("/ids", "send ids (labels for logged predictions) or probabilities (labelled directly)")
    digest = None
    if idempotency_key is not None:
        digest = await run_in_threadpool(_digest, body)
        key = f"{body.calibrator}:{idempotency_key}"
        stored = await run_in_threadpool(feedback_store.stored_response, app.sessions, key)
        if stored is not None:
            return _replay(stored, digest)
    else:
        key = None

    loaded = await resolve(app, body.calibrator, body.version)
    sent_segments = getattr(body, "segments", None)
    declared = None
    if sent_segments is not None:
        declared = await run_in_threadpool(segment_store.read_declaration, app.sessions, loaded.calibrator_id)
    try:
        if body.probabilities is None:
            for field in ("version", "accepted", "scores", "features"):
                if getattr(body, field) is not None:
                    raise Problem.invalid(f"/{field}", "only with probabilities (logged predictions carry their own)")
            ids = _check_ids(body.ids, len(body.labels))
            labels, _ = encode_labels(body.labels, len(ids), loaded.n_classes, loaded.classes)
            segments = None if sent_segments is None else check_rows(sent_segments, len(ids), declared)
            batches, by_id = None, {"ids": ids, "labels": labels, "segments": segments}
        else:
            tasks = ("binary",) if loaded.n_classes == 2 else ("multiclass",)
            columns = None if loaded.n_classes == 2 else loaded.n_classes
            probabilities = check_scores(body.probabilities, "probability", tasks, n_columns=columns, field="probabilities")
            labels, _ = encode_labels(body.labels, probabilities.shape[0], loaded.n_classes, loaded.classes)
            accepted = None if body.accepted is None else _check_flags(body.accepted, probabilities.shape[0])
            raw = None
            if body.scores is not None:
                raw = as_float_array(body.scores, "scores", ndim=(1, 2))
                if raw.shape[0] != probabilities.shape[0]:
                    raise Problem.invalid("/scores", f"has {raw.shape[0]} entries but probabilities has {probabilities.shape[0]}")
            # Ids with probabilities name the predictions: one label per id holds here too.
            prediction_ids = None if body.ids is None else _check_ids(body.ids, probabilities.shape[0], "probabilities")
            segments = None if sent_segments is None else check_rows(sent_segments, probabilities.shape[0], declared)
            sent_features = getattr(body, "features", None)
            features = None
            if sent_features is not None:
                if raw is None:
                    raise Problem.invalid("/features", "only with scores: a refit learns from the raw scores and their features")
                features = _check_features(loaded, sent_features, probabilities.shape[0])
            batches = [
                LabelledBatch(
                    loaded.version, probabilities, labels, prediction_ids=prediction_ids, accepted=accepted,
                    scores=None if raw is None else raw.tolist(), segments=segments, features=features,
                )
            ]
            by_id = {}
    except CalibrationInputError as error:
        raise locate(error) from None

    settings = app.settings
    try:
        receipt = await run_in_threadpool(
            lambda: feedback_store.record_feedback(
                app.sessions,
                calibrator_id=loaded.calibrator_id,
                batches=batches,
                prediction_ttl=settings.prediction_ttl,
                drift=DriftSettings(settings.monitor_alpha, settings.monitor_tolerance),
                idempotency_key=key,
                request_sha256=digest,
                **by_id,
            )
        )
    except IdempotencyConflict:
        return _replay(await run_in_threadpool(feedback_store.stored_response, app.sessions, key), digest)
    if receipt["count"]:
        FEEDBACK.labels(loaded.name).inc(receipt["count"])
    if receipt["duplicate_ids"]:
        FEEDBACK_DUPLICATES.labels(loaded.name).inc(len(receipt["duplicate_ids"]))
    return json_response(receipt, 202)


@router.get(
    "/calibrators/{name}/unmatched-labels",
    dependencies=[REQUIRE_READ],
    summary="Labels whose prediction never reached the log within the grace period",
    response_model=UnmatchedLabelsOut,
    responses={404: {}},
)
async def unmatched_labels(
    request: Request, name: NamePath, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> Response:
    app = services(request)
    found = await run_in_threadpool(feedback_store.pending_labels, app.sessions, name, limit)
    grace = app.settings.pending_label_grace_seconds
    return json_response({"calibrator": name, "grace_seconds": grace} | found)


@router.get(
    "/calibrators/{name}/monitor",
    dependencies=[REQUIRE_READ],
    summary="The monitors of a version: window metrics and drift alarm",
    response_model=MonitorOut,
    responses={404: {}, 409: {}},
)
async def monitor(
    request: Request, name: NamePath, version: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None
) -> Response:
    app = services(request)
    loaded = await resolve(app, name, version)

    def read() -> dict:
        found = monitors.version_monitors(app.sessions, name, loaded.calibrator_id, loaded.version, app.settings.monitor_alpha)
        return {"calibrator": name, "version": loaded.version} | {k: found[k] for k in ("windows", "drift", "segments")}

    return json_response(await run_in_threadpool(read))
