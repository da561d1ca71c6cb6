"""KServe's payload logger as the prediction log: request and response CloudEvents paired by ce-id.

KServe's logger (pkg/logger/worker.go) posts each inference request and, for a 200, its response
as two CloudEvents with the same id, in any order and at least once. The response carries the
model's score. A prediction is logged, under the event's id, once both halves are here, as
/calibrate with ``ids`` logs it; labels then come by that id through /feedback.

Unpaired halves wait in a table of this process bounded in size and age: the oldest is dropped
(and counted) when it is full or older than ``CALIBD_CLOUDEVENTS_PAIR_SECONDS``. Ids already
logged are remembered (as many) so that a half sent again is answered and ignored; one sent
again after that is still harmless, as the prediction log keeps an id's first prediction.

A half still unpaired after ``CALIBD_CLOUDEVENTS_SHARE_SECONDS`` moves to the database
(storage/cloudevent_halves.py), in the prediction log's flush, off the request path: there the
other half, which reached another process, finds it when that process moves its own half, and
that process logs the pair. A logger whose halves reach different replicas is paired, a few
seconds late; halves that come together are paired in memory and never touch the database.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import Counter
from starlette.concurrency import run_in_threadpool

from ..calibration import CalibrationInputError
from ..calibration.validation import check_arrays
from ..storage import cloudevent_halves
from ..storage.models import utcnow
from .errors import InvalidRequest

if TYPE_CHECKING:
    from .container import Services

logger = logging.getLogger("calibd")

REQUEST, RESPONSE = "request", "response"

EVENTS = Counter(
    "calibd_cloudevents_total",
    "Inference CloudEvents received, by half and outcome: waiting (for its other half), paired (logged), "
    "duplicate (a half already received or an id already logged)",
    ["half", "outcome"],
)
UNPAIRED_DROPPED = Counter(
    "calibd_cloudevents_unpaired_dropped_total",
    "Halves dropped before their other half came: the table of unpaired halves was full (full), they were too "
    "old (age), here or in the database, or could not be moved there (database, calibrator_deleted)",
    ["half", "reason"],
)
SHARED = Counter(
    "calibd_cloudevents_shared_total",
    "Halves unpaired here for CALIBD_CLOUDEVENTS_SHARE_SECONDS and moved to the database: stored (to wait "
    "there), paired (with the other half, which another process stored), duplicate (the same half was there)",
    ["outcome"],
)

#: How often a process deletes (and counts) the halves that waited in the database too long.
EXPIRY_SECONDS = 10.0


@dataclass
class _Half:
    kind: str
    calibrator_id: int
    scores: np.ndarray | None  # the response's; None for a request
    since: float


class Pairs:
    """This process's unpaired halves and recently logged ids, both bounded."""

    def __init__(self, capacity: int, max_age: float, share_after: float = 0.0):
        self.capacity = capacity
        self.max_age = max_age
        self.share_after = share_after  # 0: never moved to the database
        self.expired_at = time.monotonic()  # when the database's old halves were last deleted
        self.unpaired: OrderedDict[tuple[str, str], _Half] = OrderedDict()  # by (calibrator, ce-id)
        self.logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: Pairs not yet calibrated and logged: (loaded calibrator, its name, ce-id, the response's scores).
        self.ready: list[tuple[Any, str, str, np.ndarray]] = []
        self.ready_rows = 0

    def make_room(self, now: float) -> None:
        """Drop the oldest halves while they are too old or the table is full (one place left)."""
        while self.unpaired:
            key, half = next(iter(self.unpaired.items()))
            if now - half.since > self.max_age:
                reason = "age"
            elif len(self.unpaired) >= self.capacity:
                reason = "full"
            else:
                break
            del self.unpaired[key]
            UNPAIRED_DROPPED.labels(half.kind, reason).inc()

    def remember(self, key: tuple[str, str]) -> None:
        self.logged[key] = None
        if len(self.logged) > self.capacity:
            self.logged.popitem(last=False)


def pairs_of(services: Services) -> Pairs:
    if services.cloudevents is None:
        settings = services.settings
        services.cloudevents = Pairs(
            settings.cloudevents_max_unpaired, settings.cloudevents_pair_seconds, settings.cloudevents_share_seconds
        )
    return services.cloudevents


async def receive_inference_event(
    services: Services, kind: str, ce_id: str, calibrator: str, scores: np.ndarray | None
) -> str:
    """Take one half (``scores``: the response's chosen output as float64, None for a request).
    Returns the outcome: ``waiting``, ``paired`` or ``duplicate``. A response whose scores the
    calibrator refuses raises InvalidRequest (pointer into the response body) and keeps nothing.

    Only what the answer needs is done here, in the event loop: the checks and the pairing, a few
    dictionary operations. A pair is queued, and calibrated with the others of its calibrator in
    one call by ``log_paired`` (the prediction log's flush), not one numpy call per event."""
    pairs = pairs_of(services)
    key = (calibrator, ce_id)
    if key in pairs.logged:
        _count(kind, "duplicate")
        return "duplicate"
    # Either half names a calibrator that exists (NotFound: a 404), and a response's scores are
    # checked now, so that a bad one is refused at once rather than when paired.
    loaded = await services.calibrator(calibrator, None)
    if scores is not None:
        scores = _as_scores(loaded, scores)
    other = pairs.unpaired.get(key)
    if other is None or other.kind == kind:
        outcome = "duplicate" if other is not None else "waiting"
        if other is None:
            now = time.monotonic()
            pairs.make_room(now)
            pairs.unpaired[key] = _Half(kind, loaded.calibrator_id, scores, now)
        _count(kind, outcome)
        return outcome
    # Taken before any wait, so that a half sent again meanwhile is a duplicate, not a second pair.
    del pairs.unpaired[key]
    pairs.remember(key)
    _queue(services, pairs, loaded, calibrator, ce_id, scores if kind == RESPONSE else other.scores)
    _count(kind, "paired")
    return "paired"


def _queue(services: Services, pairs: Pairs, loaded, calibrator: str, ce_id: str, response: np.ndarray) -> None:
    rows = response.shape[0]
    if pairs.ready_rows + rows > services.settings.prediction_log_queue:  # bounded as the log is
        services.prediction_log.count_dropped(calibrator, rows)
        return
    pairs.ready.append((loaded, calibrator, ce_id, response))
    pairs.ready_rows += rows


async def flush(services: Services, everything: bool = False) -> None:
    """The prediction log's flush, for /cloudevents: move the halves unpaired for
    ``share_after`` seconds (``everything``: all of them, when the process stops) to the database,
    logging the pairs they complete there; then calibrate and log the pairs (``log_paired``)."""
    pairs = services.cloudevents
    if pairs is None:
        return
    if pairs.share_after > 0:
        await _share(services, pairs, everything)
    await log_paired(services)


async def _share(services: Services, pairs: Pairs, everything: bool) -> None:
    now = time.monotonic()
    moving = []
    while pairs.unpaired:  # oldest first
        key, half = next(iter(pairs.unpaired.items()))
        if not everything and now - half.since < pairs.share_after:
            break
        del pairs.unpaired[key]
        moving.append((key, half))
    expire_before = None
    if now - pairs.expired_at >= EXPIRY_SECONDS:
        pairs.expired_at = now
        expire_before = utcnow() - timedelta(seconds=pairs.max_age)
    if not moving and expire_before is None:
        return
    wall = utcnow()
    rows = [
        {"calibrator_id": half.calibrator_id, "event_id": key[1], "half": half.kind,
         "scores": None if half.scores is None else half.scores.tolist(),
         "received_at": wall - timedelta(seconds=now - half.since)}
        for key, half in moving
    ]
    try:
        result = await run_in_threadpool(cloudevent_halves.exchange, services.sessions, rows, expire_before)
    except Exception as error:  # the database may be away: these halves are lost, and counted
        logger.warning("cloudevents: %d unpaired halves not moved to the database: %s", len(moving), error)
        for _, half in moving:
            UNPAIRED_DROPPED.labels(half.kind, "database").inc()
        return
    for half_kind, n in result.expired.items():
        UNPAIRED_DROPPED.labels(half_kind, "age").inc(n)
    for half_kind, n in result.orphaned.items():
        UNPAIRED_DROPPED.labels(half_kind, "calibrator_deleted").inc(n)
    SHARED.labels("stored").inc(result.stored)
    SHARED.labels("duplicate").inc(result.duplicates)
    for (calibrator, ce_id), half in moving:
        found = result.paired.get((half.calibrator_id, ce_id), False)
        if found is False:
            continue
        SHARED.labels("paired").inc()
        pairs.remember((calibrator, ce_id))
        try:
            loaded = await services.calibrator(calibrator, None)
        except Exception as error:  # deleted meanwhile, say
            logger.warning("cloudevents: pair %s of %s not logged: %s", ce_id, calibrator, error)
            continue
        response = half.scores if half.kind == RESPONSE else np.asarray(found, dtype=np.float64)
        _queue(services, pairs, loaded, calibrator, ce_id, response)


async def log_paired(services: Services) -> None:
    """Calibrate the pairs queued since the last call, one predict per calibrator version (in a worker
    thread: a large queue or a heavy method would hold the event loop), and add them to the prediction
    log (under ce-id, or ce-id/0, ce-id/1, ... for a response of several rows)."""
    pairs = services.cloudevents
    if pairs is None or not pairs.ready:
        return
    ready, pairs.ready, pairs.ready_rows = pairs.ready, [], 0
    logged, dropped = await run_in_threadpool(_calibrate_pairs, ready)
    for entry in logged:
        services.prediction_log.add(*entry)
    for name, n in dropped:
        services.prediction_log.count_dropped(name, n)


def _calibrate_pairs(ready: list) -> tuple[list[tuple], list[tuple[str, int]]]:
    """The prediction log's entries of ``ready`` pairs, grouped by calibrator version, and what could
    not be calibrated (name, rows): a group that fails is dropped and counted, not the whole queue."""
    groups: dict[tuple[int, int], list] = {}
    for entry in ready:
        groups.setdefault((entry[0].calibrator_id, entry[0].version), []).append(entry)
    logged, dropped = [], []
    for group in groups.values():
        loaded, name = group[0][0], group[0][1]
        try:
            scores = group[0][3] if len(group) == 1 else np.concatenate([entry[3] for entry in group])
            probabilities, extras = loaded.calibrator.predict_details(scores)
        except Exception as error:  # checked when received: not expected
            rows = sum(entry[3].shape[0] for entry in group)
            logger.warning("cloudevents: %d predictions of %s not logged: %s", rows, name, error)
            dropped.append((name, rows))
            continue
        ids = []
        for _, _, ce_id, response in group:
            n = response.shape[0]
            ids.extend([ce_id] if n == 1 else [f"{ce_id}/{i}" for i in range(n)])
        logged.append((loaded.calibrator_id, name, loaded.version, ids, probabilities, extras.get("accepted"),
                       scores.tolist()))
    return logged, dropped


def _count(kind: str, outcome: str) -> None:
    counter = _COUNTERS.get((kind, outcome))
    if counter is None:
        counter = _COUNTERS[(kind, outcome)] = EVENTS.labels(kind, outcome)
    counter.inc()


_COUNTERS: dict[tuple[str, str], Counter] = {}


def _as_scores(loaded, values: np.ndarray) -> np.ndarray:
    """The model's output as the calibrator's scores: a binary calibrator takes the class-1 column
    of a two-column output (scikit-learn's predict_proba), otherwise the output as it is."""
    if values.ndim == 0:
        raise InvalidRequest("/outputs", "the chosen output is a single number, not one score per row")
    if loaded.n_classes == 2 and values.ndim == 2 and values.shape[1] == 2:
        values = np.ascontiguousarray(values[:, 1])
    if loaded.n_classes == 2 and values.ndim != 1:
        raise InvalidRequest("/outputs", f"a binary calibrator takes one score per row; the output's shape is {list(values.shape)}")
    if loaded.n_classes > 2 and (values.ndim != 2 or values.shape[1] != loaded.n_classes):
        raise InvalidRequest("/outputs", f"calibrator of {loaded.n_classes} classes; the output's shape is {list(values.shape)}")
    if values.shape[0] == 0:
        raise InvalidRequest("/outputs", "the chosen output has no rows")
    try:  # what predict_details will check, so that log_paired does not refuse it later
        values = loaded.calibrator.check_predict_scores(values)
        check_arrays({}, loaded.calibrator.predict_arrays, values.shape[0])
    except CalibrationInputError as error:
        raise InvalidRequest("/outputs", str(error)) from None
    return values
