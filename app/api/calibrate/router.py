"""/calibrate: the hot path, called once per prediction batch.

Parsed by hand with orjson and validated as numpy arrays; the calibrator comes
from the in-memory store, and the database is read only on a cache miss.
"""

from __future__ import annotations

import os

import numpy as np
import orjson
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from ...calibration import CalibrationInputError
from ...calibration.columns import check_columns
from ...calibration.decisions import check_costs, decide
from ...monitoring.segments import check_rows
from ...storage import segments as segment_store
from ...storage.cache import LoadedCalibrator
from ...storage.feedback import feature_rows
from ..auth import REQUIRE_CALIBRATE
from ..bodies import check_depth, float_array
from ..edge import answer_error, asgi_route, json_request, send_json
from ..observability import count_calibrated
from ..problems import Problem, input_error
from ..state import Services
from ..validation import MAX_VERSION, check_ids, request_body
from .schemas import CalibrateRequest, CalibrateResponse

router = APIRouter(tags=["calibrate"])

# Any other field is one of the method's extra arrays (``features``, ...).
_FIELDS = frozenset({"calibrator", "version", "scores", "ids", "costs"})
_PLAIN_FIELDS = frozenset({"calibrator", "version", "scores"})
_VERSION_TYPES = (int, type(None))


async def calibrate(scope: Scope, receive: Receive, send: Send) -> None:
    """POST /calibrate, a plain ASGI endpoint (``asgi_route``): key, body, calibration, answer."""
    plain = False
    try:
        services = scope["app"].state.services
        data, raw = await json_request(scope, receive, services, "calibrate")
        plain = _plain(data)
        if not plain:
            check_depth(raw)
        name, version, scores, ids, arrays = _envelope(data)
        segments = arrays.pop("segments", None)
        loaded, probabilities, extras = await calibrate_batch(
            services, name, version, scores, ids, arrays, data.get("costs"), segments
        )
        body = {"calibrator": name, "version": loaded.version, "probabilities": probabilities, **extras}
        if loaded.classes is not None:
            body["classes"] = loaded.classes  # the order of the columns (or of class 1 for binary)
        payload = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except Exception as error:
        if plain:  # scores nested too deep are answered as such, not as bad scores
            error = _too_deep(raw) or error
        await answer_error(scope, receive, send, error)
        return
    await send_json(send, payload)


asgi_route(
    router, "/calibrate", calibrate, ["POST"],
    dependencies=[REQUIRE_CALIBRATE],
    summary="Calibrate a batch of scores",
    openapi_extra=request_body(("application/json", CalibrateRequest)),
    responses={200: {"model": CalibrateResponse}, 404: {}, 409: {}, 413: {}, 415: {}, 422: {}},
)


async def calibrate_batch(
    services: Services, name: str, version: int | None, scores: object, ids: list[str] | None, arrays: dict, costs: object = None,
    segments: object = None,
) -> tuple[LoadedCalibrator, np.ndarray, dict]:
    """Calibrate one batch: what /calibrate and the inference protocol's routes share.

    ``scores`` is the JSON list or an array; ``arrays`` the method's extra arrays. Returns the
    version served, the probabilities and the extras (``decisions`` among them, given costs);
    logs the predictions under ``ids`` (with their ``segments``, checked against the calibrator's
    declared dimensions, and the named ``features`` a feature-taking method was sent: labels by
    id inherit both) and counts them. Bad input raises a 422 Problem whose
    pointers name /calibrate's fields (``/scores``, ``/ids``, ``/costs``, ...).
    """
    if isinstance(scores, (list, np.ndarray)) and len(scores) > services.settings.max_batch_scores:
        limit = services.settings.max_batch_scores
        raise Problem.invalid("/scores", f"{len(scores)} scores is more than one request may carry ({limit}, CALIBD_MAX_BATCH_SCORES)")
    loaded = await services.calibrator(name, version)
    try:
        # The JSON list as it is to a compiled kernel, else as a float64 array when it is plainly one.
        probabilities = None if arrays else loaded.calibrator.predict_compiled(scores)
        extras: dict = {}
        if probabilities is None:
            values = float_array(scores)
            probabilities, extras = loaded.calibrator.predict_details(scores if values is None else values, **arrays)
    except CalibrationInputError as error:
        raise input_error(error, ()) from None
    if ids is not None:
        if len(ids) != probabilities.shape[0]:
            raise Problem.invalid("/ids", f"has {len(ids)} entries but scores has {probabilities.shape[0]}")
        logged = scores.tolist() if isinstance(scores, np.ndarray) else scores
        rows = None if segments is None else await _segment_rows(services, loaded, segments, len(ids))
        features = _feature_rows(loaded, arrays.get("features"), len(ids))
        services.prediction_log.add(
            loaded.calibrator_id, name, loaded.version, ids, probabilities, extras.get("accepted"), logged, rows, features
        )
    elif segments is not None:
        raise Problem.invalid("/segments", "only with ids: segment values are kept with the logged predictions")
    if costs is not None:
        try:
            decisions = decide(probabilities, check_costs(costs, loaded.n_classes))
        except CalibrationInputError as error:
            raise input_error(error, ()) from None
        extras["decisions"] = decisions if loaded.classes is None else [loaded.classes[d] for d in decisions]
    count_calibrated(name, probabilities.shape[0])
    return loaded, probabilities, extras


async def _segment_rows(services: Services, loaded: LoadedCalibrator, segments: object, n: int) -> list[dict[str, str]]:
    """Checked segment values as one {dimension: value} per prediction (off the path when not sent)."""
    declared = await run_in_threadpool(segment_store.read_declaration, services.sessions, loaded.calibrator_id)
    try:
        columns = check_rows(segments, n, declared)
    except CalibrationInputError as error:
        raise input_error(error, ()) from None
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(columns[k].tolist() for k in names))]


def _feature_rows(loaded: LoadedCalibrator, features: object, n: int) -> list[dict] | None:
    """The named features a feature-taking method was sent, one {column: value} per prediction, kept
    so that a refit learns from them; None when none were sent (the plain path pays nothing)."""
    if features is None:
        return None
    spec = loaded.calibrator.predict_arrays.get("features")
    if spec is None or not spec.columns:  # a selective method's embedding: not kept
        return None
    return feature_rows(check_columns(features, "features", n))  # checked by the calibrator already


def _plain(data: dict) -> bool:
    """Whether the body is the usual request: a name, perhaps a version, and scores. Its text
    then needs no scan for depth: scores a calibrator accepts are numbers or rows of numbers,
    three levels at most, and scores it refuses are checked for depth then (``_too_deep``)."""
    return (
        data.keys() <= _PLAIN_FIELDS
        and type(data.get("calibrator")) is str
        and type(data.get("version")) in _VERSION_TYPES
    )


def _too_deep(raw: bytes) -> Problem | None:
    """The 400 for a body nested deeper than calibd takes, or None."""
    try:
        check_depth(raw)
    except Problem as problem:
        return problem
    return None


def _envelope(data: dict) -> tuple[str, int | None, object, list[str] | None, dict]:
    """Check the request's fields by hand: cheaper than a pydantic model per request.

    Fields beyond the standard ones are a method's extra arrays (``features``);
    the calibrator rejects names it does not take.
    """
    extra = data.keys() - _FIELDS
    arrays = {key: data[key] for key in extra} if extra else {}
    name = data.get("calibrator")
    if not isinstance(name, str):
        raise Problem.invalid("/calibrator", "required: the calibrator's name, a string")
    version = data.get("version")
    if version is not None and (type(version) is not int or not 1 <= version <= MAX_VERSION):
        raise Problem.invalid("/version", f"must be a positive integer (at most {MAX_VERSION}) or null")
    if "scores" not in data:
        raise Problem.invalid("/scores", "required: a list of scores")
    ids = data.get("ids")
    if ids is not None:
        check_ids(ids)
    return name, version, data["scores"], ids, arrays


if os.environ.get("CALIBD_BENCHMARK_ROUTES") == "1":
    # The benchmarks' baseline (benchmarks/calibrate_throughput.py), never served in
    # production: the same request read, parsed and checked as /calibrate does, the
    # scores made the float64 array the calibrator would get, with the same middleware
    # and auth, answered with that array without calibrating. /calibrate's throughput
    # over this one is the cost of calibration.
    async def calibrate_baseline(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data, raw = await json_request(scope, receive, scope["app"].state.services, "calibrate")
            if not _plain(data):
                check_depth(raw)
            name, version, scores, ids, arrays = _envelope(data)
            values = float_array(scores)
            body = {"calibrator": name, "version": version or 1, "probabilities": scores if values is None else values}
            payload = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        except Exception as error:
            await answer_error(scope, receive, send, error)
            return
        await send_json(send, payload)

    asgi_route(router, "/benchmark/calibrate-baseline", calibrate_baseline, ["POST"], include_in_schema=False)
