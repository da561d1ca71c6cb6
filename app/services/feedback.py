"""Feedback: labels for logged predictions, or labelled probabilities, recorded once and fed to the monitors
when their predictions are mature.

``record(services, request, idempotency_key=None)`` is the one entry point,
for the HTTP route and any other transport. A request commits in one
transaction: its labelled rows, the monitor updates of the rows that are
mature, its pending labels, and the idempotency record. Either all of it is
stored, or none.

Label timing: a calibrator whose labels are final on arrival (no label window)
feeds each label to the monitors as it is recorded, at its prediction's time.
A calibrator with a window stores labels as waiting; ``mature`` (a background
step) feeds the monitors, in prediction-time order, every prediction whose
window has passed, with its label, or as an implied negative (or counted as
unlabelled) when none came. A label that comes after its prediction matured
is late: counted (``late_ids`` in the receipt, ``calibd_late_labels_total``)
and left out of everything, so that what the monitors have bet on never
changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from ..calibration import CalibrationInputError
from ..calibration.base import as_float_array, check_scores, encode_labels
from ..calibration.columns import check_columns
from ..calibration.multicalibration import MulticalibrationCalibrator
from ..monitoring import label_delay
from ..monitoring.segments import check_rows
from ..monitoring.windows import feedback_terms
from ..storage import feedback as feedback_store
from ..storage import idempotency
from ..storage import maturity as maturity_store
from ..storage import pending_labels
from ..storage import segments as segment_store
from ..storage.cache import LoadedCalibrator
from ..storage.db import transaction
from ..storage.feedback import LabelledBatch, feature_rows
from ..storage.maturity import LabelSettings
from ..storage.models import utcnow
from ..storage.predictions import LoggedPrediction, find_predictions
from ..storage.repository import NotFound, Sessions, hold_calibrator
from . import monitoring
from .errors import InvalidRequest
from .monitoring import DriftSettings

if TYPE_CHECKING:  # the container is built by the app; only its attributes are used here
    from .container import Services

logger = logging.getLogger("calibd")

#: The longest an id may be (as /calibrate takes them).
MAX_ID_LENGTH = 128
#: A prediction time may run ahead of this server's clock by this much (clocks apart).
CLOCK_SKEW = timedelta(minutes=5)


@dataclass
class FeedbackRequest:
    """What a feedback request says: the API's JSON body, a table upload, or a message from a stream.

    Either ``ids`` and ``labels`` (labels for predictions logged by /calibrate),
    or ``probabilities`` and ``labels`` (self-contained labelled predictions,
    optionally named by ``ids``, with ``accepted``, ``scores``, ``features``).
    ``predicted_at``, with probabilities only: when the predictions were made,
    one ISO 8601 time for the batch or one per row; without it they are
    mature on arrival.
    """

    calibrator: str
    labels: Any
    ids: Any = None
    probabilities: Any = None
    version: int | None = None
    accepted: Any = None
    scores: Any = None
    segments: dict[str, Any] | None = None
    features: dict[str, Any] | None = None
    predicted_at: Any = None

    @classmethod
    def of(cls, body: Any) -> FeedbackRequest:
        """From any object with these attributes (a validated API body, say)."""
        return cls(**{f.name: getattr(body, f.name, None) for f in fields(cls)})

    def digest(self) -> str:
        """sha256 of what the request says (its fields, keys sorted), whatever the encoding."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if values["predicted_at"] is None:  # digests of requests from before prediction times match
            del values["predicted_at"]
        try:
            text = orjson.dumps(values, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY, default=_plain)
        except orjson.JSONEncodeError:  # integers beyond 64 bits: refused later, but hashed first
            text = json.dumps(values, sort_keys=True, default=_plain).encode()
        return hashlib.sha256(text).hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):  # the dtypes orjson leaves out (strings, objects)
        return value.tolist()
    raise TypeError(type(value).__name__)


@dataclass(frozen=True)
class Receipt:
    """The answer to a feedback request; ``replayed``: given before to the same Idempotency-Key."""

    response: dict[str, Any]
    replayed: bool = False


class IdempotencyKeyReused(InvalidRequest):
    """The Idempotency-Key was used with another request."""


IDEMPOTENCY_KEY = "/header/Idempotency-Key"


def record(services: Services, request: FeedbackRequest, idempotency_key: str | None = None) -> Receipt:
    """Validate and record one feedback request; returns its receipt (blocking: call it from a worker thread).

    Raises InvalidRequest or CalibrationInputError (a value is wrong: nothing is
    stored), IdempotencyKeyReused, and NotFound (no such calibrator or version).
    A request sent again with the same ``idempotency_key`` gets the first
    receipt back (``replayed``), and is recorded once.
    """
    if request.ids is None and request.probabilities is None:
        raise InvalidRequest("/ids", "send ids (labels for logged predictions) or probabilities (labelled directly)")
    digest = key = None
    if idempotency_key is not None:
        digest = request.digest()
        key = f"{request.calibrator}:{idempotency_key}"
        stored = idempotency.stored_response(services.sessions, key)
        if stored is not None:
            return _replay(stored, digest)
    loaded = services.store.get(request.calibrator, request.version) or services.store.load(request.calibrator, request.version)
    batches, by_id = _validate(services, loaded, request)
    settings = services.settings
    try:
        response = record_feedback(
            services.sessions, calibrator_id=loaded.calibrator_id, batches=batches, **by_id,
            prediction_ttl=settings.prediction_ttl, drift=DriftSettings(settings.monitor_alpha, settings.monitor_tolerance),
            idempotency_key=key, request_sha256=digest,
        )
    except idempotency.IdempotencyConflict:
        return _replay(idempotency.stored_response(services.sessions, key), digest)
    return Receipt(response)


def _replay(stored: idempotency.StoredRequest, digest: str | None) -> Receipt:
    if not stored.same_request(digest):
        # IETF httpapi Idempotency-Key draft: a key reused with another payload is refused.
        raise IdempotencyKeyReused(IDEMPOTENCY_KEY, "this Idempotency-Key was used with a different request body; use a new key")
    return Receipt(stored.response, replayed=True)


# -- validation ------------------------------------------------------------------------
def _validate(services: Services, loaded: LoadedCalibrator, body: FeedbackRequest) -> tuple[list[LabelledBatch] | None, dict]:
    """The request's rows, checked as /calibrate checks them for this version: batches of self-contained
    rows, or the ids, labels and segments of labels for logged predictions."""
    declared = None
    if body.segments is not None:
        declared = segment_store.read_declaration(services.sessions, loaded.calibrator_id)
    if body.probabilities is None:
        for name in ("version", "accepted", "scores", "features", "predicted_at"):
            if getattr(body, name) is not None:
                raise InvalidRequest(f"/{name}", "only with probabilities (logged predictions carry their own)")
        ids = _check_ids(body.ids, len(body.labels))
        labels, _ = encode_labels(body.labels, len(ids), loaded.n_classes, loaded.classes)
        segments = None if body.segments is None else check_rows(body.segments, len(ids), declared)
        return None, {"ids": ids, "labels": labels, "segments": segments}
    tasks = ("binary",) if loaded.n_classes == 2 else ("multiclass",)
    columns = None if loaded.n_classes == 2 else loaded.n_classes
    probabilities = check_scores(body.probabilities, "probability", tasks, n_columns=columns, field="probabilities")
    n = probabilities.shape[0]
    labels, _ = encode_labels(body.labels, n, loaded.n_classes, loaded.classes)
    accepted = None if body.accepted is None else _check_flags(body.accepted, n)
    raw = None
    if body.scores is not None:
        raw = as_float_array(body.scores, "scores", ndim=(1, 2))
        if raw.shape[0] != n:
            raise InvalidRequest("/scores", f"has {raw.shape[0]} entries but probabilities has {n}")
    # Ids with probabilities name the predictions: one label per id holds here too.
    prediction_ids = None if body.ids is None else _check_ids(body.ids, n, "probabilities")
    segments = None if body.segments is None else check_rows(body.segments, n, declared)
    features = None
    if body.features is not None:
        if raw is None:
            raise InvalidRequest("/features", "only with scores: a refit learns from the raw scores and their features")
        features = _check_features(loaded, body.features, n)
    predicted_at = None if body.predicted_at is None else _check_times(body.predicted_at, n)
    batch = LabelledBatch(
        loaded.version, probabilities, labels, prediction_ids=prediction_ids, accepted=accepted,
        scores=None if raw is None else raw.tolist(), segments=segments, features=features, predicted_at=predicted_at,
    )
    return [batch], {}


def check_id_strings(ids: list, at: str = "/ids") -> None:
    """Prediction ids: non-empty strings of at most MAX_ID_LENGTH characters, without NUL."""
    for position, value in enumerate(ids):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH or "\x00" in value:
            raise InvalidRequest(f"{at}/{position}", f"ids are non-empty strings of at most {MAX_ID_LENGTH} characters, without NUL")


def _check_ids(ids: list, n: int, against: str = "labels") -> list[str]:
    check_id_strings(ids)
    if len(ids) != n:
        if against == "labels":
            raise InvalidRequest("/labels", f"has {n} entries but ids has {len(ids)}")
        raise InvalidRequest("/ids", f"has {len(ids)} entries but {against} has {n}")
    return ids


def _check_flags(values: list, n: int) -> np.ndarray:
    for position, value in enumerate(values):
        if not isinstance(value, bool):
            raise InvalidRequest(f"/accepted/{position}", "must be true or false")
    if len(values) != n:
        raise InvalidRequest("/accepted", f"has {len(values)} entries but probabilities has {n}")
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
        fitted.check_features(columns)
    return feature_rows(columns)


def parse_time(value: Any) -> datetime:
    """An ISO 8601 time (a time without offset is UTC), or a datetime; raises ValueError."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and len(value) <= 64:
        moment = datetime.fromisoformat(value.strip())
    else:
        raise ValueError("not a time")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _check_times(value: Any, n: int) -> list[datetime]:
    """``predicted_at``: one time for the batch, or one per row; none later than now (give or take skew)."""
    latest = utcnow() + CLOCK_SKEW
    if isinstance(value, (list, tuple, np.ndarray)):
        values = list(value)
        if len(values) != n:
            raise InvalidRequest("/predicted_at", f"has {len(values)} entries but probabilities has {n}")
        pointers = [f"/predicted_at/{i}" for i in range(n)]
    else:
        values, pointers = [value], ["/predicted_at"]
    times = []
    for pointer, item in zip(pointers, values):
        try:
            moment = parse_time(item)
        except (ValueError, TypeError):
            raise InvalidRequest(pointer, "an ISO 8601 time, e.g. \"2026-11-27T01:00:00Z\"") from None
        if moment > latest:
            raise InvalidRequest(pointer, "is in the future")
        times.append(moment)
    return times if len(times) == n else times * n


# -- recording ----------------------------------------------------------------------------
#: Deadlock detected, serialization failure: the transaction was rolled back and can run again.
_RETRYABLE = ("40P01", "40001")
_ATTEMPTS = 3


def record_feedback(
    sessions: Sessions,
    *,
    calibrator_id: int,
    batches: list[LabelledBatch] | None = None,
    ids: list[str] | None = None,
    labels: np.ndarray | None = None,
    segments: dict[str, np.ndarray] | None = None,
    prediction_ttl: timedelta,
    drift: DriftSettings,
    idempotency_key: str | None = None,
    request_sha256: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Record validated labelled predictions, given directly (``batches``) or by logged id (``ids``, ``labels``).

    One label per prediction id, the first one received: a label for an id
    already labelled (or already waiting as a pending label, or repeated in
    the request) is not recorded and is listed in ``duplicate_ids``. A label
    for an id not in the prediction log yet is stored as a pending label
    (listed in ``unknown_ids`` and counted in ``pending``), joined when its
    prediction is written. ``segments`` (with ``ids``): segment values per
    dimension for the labelled rows, over those logged with their predictions.

    Returns the receipt. With an ``idempotency_key`` the receipt and the
    request's digest are stored in the same transaction; a concurrent request
    with the same key raises IdempotencyConflict.
    """
    now = now or utcnow()
    by_id = {} if ids is None else {"ids": ids, "labels": labels, "segments": segments}
    for attempt in range(_ATTEMPTS):
        try:
            return _record(sessions, calibrator_id, batches, by_id, prediction_ttl, drift, idempotency_key,
                           request_sha256, now)
        except OperationalError as error:
            # A deadlock the sorted inserts do not rule out (pending labels claimed by a request
            # and a sweep at once, say): the loser was rolled back whole, and runs again.
            if attempt + 1 == _ATTEMPTS or getattr(error.orig, "sqlstate", None) not in _RETRYABLE:
                raise
            time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
    raise AssertionError("unreachable")


def _record(
    sessions: Sessions, calibrator_id: int, batches: list[LabelledBatch] | None, by_id: dict, ttl: timedelta,
    drift: DriftSettings, key: str | None, digest: str | None, now: datetime,
) -> dict[str, Any]:
    try:
        with transaction(sessions) as session:
            receipt = {"count": 0, "pending": 0, "unknown_ids": [], "expired_ids": [], "duplicate_ids": []}
            timing = _hold(session, calibrator_id)
            if timing.window_seconds is not None:  # only a calibrator with a label window has late labels
                receipt["late_ids"] = []
            if by_id:
                batches = _labels_by_id(session, calibrator_id, by_id["ids"], by_id["labels"], now, ttl, receipt, by_id["segments"])
            late = 0
            for batch in batches or []:
                batch, repeated = batch.first_of_each_id()
                receipt["duplicate_ids"] += repeated
                stored = store(session, calibrator_id, batch, now, drift, timing)
                receipt["count"] += stored.count
                receipt["duplicate_ids"] += stored.duplicate_ids
                if stored.late_ids:
                    receipt["late_ids"] += stored.late_ids
                late += stored.late
            maturity_store.count(session, calibrator_id, late=late)
            request_ids = by_id["ids"] if by_id else [i for b in batches or [] for i in b.prediction_ids or []]
            _in_request_order(receipt, request_ids)
            if key is not None:
                idempotency.remember(session, key, calibrator_id, receipt, digest, now)
            return receipt
    except IntegrityError:
        if key is not None and idempotency.stored_response(sessions, key) is not None:
            raise idempotency.IdempotencyConflict(key) from None
        raise


def _hold(session: Session, calibrator_id: int) -> LabelSettings:
    """Keep the calibrator from being deleted until the transaction ends, and read (with a window: hold)
    its label settings. Feedback rows have no foreign key (one check per row): the hold replaces it."""
    hold_calibrator(session, calibrator_id)
    timing = maturity_store.settings_of(session, calibrator_id, lock=True)
    if timing is None:
        raise NotFound(f"#{calibrator_id}")
    return timing


def _in_request_order(receipt: dict[str, Any], request_ids: list[str]) -> None:
    """Sort the receipt's id lists as the ids first appear in the request."""
    order: dict[str, int] = {}
    for position, prediction_id in enumerate(request_ids):
        order.setdefault(prediction_id, position)
    for name in ("unknown_ids", "expired_ids", "duplicate_ids", "late_ids"):
        if len(receipt.get(name, ())) > 1:
            receipt[name].sort(key=order.__getitem__)


@dataclass
class Stored:
    """What storing a batch did: rows recorded, ids left out as duplicates, late labels (and their ids)."""

    count: int
    duplicate_ids: list[str]
    late: int = 0
    late_ids: list[str] = field(default_factory=list)


def store(
    session: Session, calibrator_id: int, batch: LabelledBatch, now: datetime, drift: DriftSettings, timing: LabelSettings
) -> Stored:
    """Store a batch's rows; feed those that are mature to the monitors, keep the others waiting.

    With a label window, rows whose prediction time is known wait for maturity,
    and rows whose prediction matured already are late (left out, counted).
    Rows without a prediction time are mature on arrival.
    """
    late, late_ids = 0, []
    waiting = timing.window_seconds is not None and batch.predicted_at is not None
    if waiting and timing.matured_through is not None:
        is_late = np.array([t <= timing.matured_through for t in batch.predicted_at], dtype=bool)
        if is_late.any():
            late = int(is_late.sum())
            late_ids = [i for i, x in zip(batch.prediction_ids, is_late) if x] if batch.prediction_ids else []
            _count_delays(session, calibrator_id, batch.subset(is_late), now)
            batch = batch.subset(~is_late)
    if not batch.labels.shape[0]:
        return Stored(0, [], late, late_ids)
    terms = feedback_terms(batch.probabilities, batch.labels, batch.accepted)
    inserted = feedback_store.insert(session, calibrator_id, batch, terms.probability, now, waiting)
    duplicates: list[str] = []
    if inserted is not None and len(inserted) < len(batch.prediction_ids):
        went_in = set(inserted)
        duplicates = [i for i in batch.prediction_ids if i not in went_in]
        batch = batch.subset(np.array([i in went_in for i in batch.prediction_ids], dtype=bool))
    n = batch.labels.shape[0]
    if n:
        _count_delays(session, calibrator_id, batch, now)
        if not waiting:
            monitoring.update(
                session, calibrator_id, batch.version, batch.probabilities, batch.labels, batch.accepted,
                batch.predicted_at or [now] * n, batch.segments, drift, now,
            )
    return Stored(n, duplicates, late, late_ids)


def _count_delays(session: Session, calibrator_id: int, batch: LabelledBatch, now: datetime) -> None:
    """Add the delays of labels whose prediction time is known to the calibrator's histogram (binary)."""
    if batch.predicted_at is None or batch.probabilities.ndim != 1 or not batch.labels.shape[0]:
        return
    times = batch.predicted_at
    if times.count(times[0]) == len(times):  # one /calibrate request's predictions: one time
        delays = np.full(len(times), (now - times[0]).total_seconds())
    else:
        delays = np.array([(now - t).total_seconds() for t in times])
    maturity_store.add_delays(session, calibrator_id, label_delay.delay_counts(delays, batch.labels))


def _labels_by_id(
    session: Session, calibrator_id: int, ids: list[str], labels: np.ndarray, now: datetime, ttl: timedelta,
    receipt: dict[str, Any], segments: dict[str, np.ndarray] | None = None,
) -> list[LabelledBatch]:
    """Labels for logged ids as batches to store; the others pending, expired or duplicate (in ``receipt``)."""
    first: dict[str, int] = {}
    for position, prediction_id in enumerate(ids):
        if prediction_id in first:
            receipt["duplicate_ids"].append(prediction_id)
        else:
            first[prediction_id] = position
    label_of = {prediction_id: int(labels[position]) for prediction_id, position in first.items()}
    logged = find_predictions(session, calibrator_id, list(first))
    # A label that waited for this prediction came first: it is the one joined, this one is the duplicate.
    waited = pending_labels.claim(session, calibrator_id, [i for i in first if i in logged]) if pending_labels.any_waiting(session) else []
    for prediction_id, label in waited:
        receipt["duplicate_ids"].append(prediction_id)
        label_of[prediction_id] = label
    missing = [i for i in first if i not in logged]
    if missing:
        waiting = set(pending_labels.add(session, calibrator_id, missing, label_of, now))
        receipt["unknown_ids"] += [i for i in missing if i in waiting]
        receipt["duplicate_ids"] += [i for i in missing if i not in waiting]
        receipt["pending"] = len(waiting)
    given = None
    if segments:
        given = {i: {k: v[position] for k, v in segments.items()} for i, position in first.items()}
    batches, expired = _group_logged(logged, label_of, now - ttl, given)
    receipt["expired_ids"] += expired
    return batches


def _group_logged(
    logged: dict[str, LoggedPrediction], label_of: dict[str, int], oldest: datetime,
    given_segments: dict[str, dict[str, str]] | None = None,
) -> tuple[list[LabelledBatch], list[str]]:
    """Labelled logged predictions grouped by the version that served them; and the expired ids.

    A row's segment values are those logged with its prediction, overridden by
    any the label came with (``given_segments`` by id).
    """
    expired = []
    groups: dict[int, list[str]] = defaultdict(list)
    for prediction_id, prediction in logged.items():
        if prediction.created_at < oldest:
            expired.append(prediction_id)
        else:
            groups[prediction.version].append(prediction_id)
    batches = []
    for version, members in sorted(groups.items()):
        predictions = [logged[i] for i in members]
        accepted = [p.accepted for p in predictions]
        scores = [p.scores for p in predictions]
        features = [p.features for p in predictions]
        batches.append(
            LabelledBatch(
                version=version,
                probabilities=np.array([p.probabilities for p in predictions], dtype=np.float64),
                labels=np.array([label_of[i] for i in members], dtype=np.int64),
                prediction_ids=members,
                accepted=None if any(a is None for a in accepted) else np.array(accepted, dtype=bool),
                scores=None if any(score is None for score in scores) else scores,
                segments=segment_columns([(logged[i].segments or {}) | ((given_segments or {}).get(i) or {}) for i in members]),
                features=None if all(f is None for f in features) else features,
                predicted_at=[p.created_at for p in predictions],
            )
        )
    return batches, expired


def segment_columns(per_row: list[dict[str, str] | None]) -> dict[str, np.ndarray] | None:
    """Per-row segment values ({dimension: value}) as columns (None where a row has no value)."""
    dimensions = dict.fromkeys(k for row in per_row for k in row or {})
    if not dimensions:
        return None
    columns = {}
    for dimension in dimensions:
        column = np.empty(len(per_row), dtype=object)
        column[:] = [(row or {}).get(dimension) for row in per_row]
        columns[dimension] = column
    return columns


# -- labels that came before their prediction -----------------------------------------------
@dataclass
class JoinCounts:
    """What a join did, by calibrator name: labels joined, duplicates dropped, labels gone unmatched."""

    joined: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    duplicates: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unmatched: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __bool__(self) -> bool:
        return any(self.joined.values()) or any(self.duplicates.values()) or any(self.unmatched.values())


@dataclass(frozen=True)
class PendingJoin:
    """How pending labels are joined: the drift test's settings, the prediction TTL, and the grace period."""

    drift: DriftSettings
    prediction_ttl: timedelta
    grace: timedelta


def join_pending(session: Session, join: PendingJoin, now: datetime | None = None) -> JoinCounts:
    """Join every pending label whose prediction is now in the log, in the session's transaction
    (every process may: a claimed label is gone for the others)."""
    now = now or utcnow()
    counts = JoinCounts()
    if not pending_labels.any_waiting(session):
        return counts
    claimed = pending_labels.claim_joinable(session)
    if not claimed:
        return counts
    by_calibrator: dict[int, dict[str, int]] = defaultdict(dict)
    for calibrator_id, prediction_id, label in claimed:
        by_calibrator[calibrator_id][prediction_id] = label
    names = pending_labels.names(session, list(by_calibrator))
    for calibrator_id, label_of in sorted(by_calibrator.items()):
        name = names.get(calibrator_id, str(calibrator_id))
        timing = _hold(session, calibrator_id)
        logged = find_predictions(session, calibrator_id, list(label_of))
        batches, expired = _group_logged(logged, label_of, now - join.prediction_ttl)
        counts.unmatched[name] += len(expired)
        late = 0
        for batch in batches:
            stored = store(session, calibrator_id, batch, now, join.drift, timing)
            counts.joined[name] += stored.count
            counts.duplicates[name] += len(stored.duplicate_ids)
            late += stored.late
        maturity_store.count(session, calibrator_id, late=late)
    return counts


def sweep_pending(sessions: Sessions, join: PendingJoin, now: datetime | None = None) -> JoinCounts:
    """Join pending labels whose prediction has been written, then mark those past the grace period unmatched."""
    now = now or utcnow()
    with transaction(sessions) as session:
        if not pending_labels.any_waiting(session):
            return JoinCounts()
        counts = join_pending(session, join, now)
        unmatched = pending_labels.mark_unmatched(session, now - join.grace, now)
        if unmatched:
            names = pending_labels.names(session, list(unmatched))
            for calibrator_id, n in unmatched.items():
                counts.unmatched[names.get(calibrator_id, str(calibrator_id))] += n
    return counts
