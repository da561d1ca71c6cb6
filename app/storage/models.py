"""Database tables. The schema changes only through Alembic migrations (migrations/)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, UniqueConstraint, false, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC timestamp on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class CalibratorRow(Base):
    """A named calibrator: a counter of its versions and which one is current."""

    __tablename__ = "calibrators"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    # A fresh random id per creation: a deleted and re-created name never
    # reuses a cache entry of its predecessor.
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    latest_version: Mapped[int] = mapped_column(Integer, default=0)
    current_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: Transformer mode: the upstream OIP v2 model server this calibrator's /v2 infer forwards to.
    predictor: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: How long after a prediction its label can still arrive (null: labels are final on arrival).
    label_window_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: A logged prediction without a label at the end of its window: "negative" or "unlabelled".
    label_missing: Mapped[str] = mapped_column(String(16), default="negative", server_default="negative")

    versions: Mapped[list[VersionRow]] = relationship(
        back_populates="calibrator", cascade="all, delete-orphan", passive_deletes=True, order_by="VersionRow.version"
    )


class VersionRow(Base):
    """One immutable fitted version of a calibrator."""

    __tablename__ = "calibrator_versions"
    __table_args__ = (UniqueConstraint("calibrator_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(64))
    input_kind: Mapped[str] = mapped_column(String(16))
    n_classes: Mapped[int] = mapped_column(Integer)
    classes: Mapped[list[Any] | None] = mapped_column(JSONType, nullable=True)
    parameters: Mapped[dict[str, Any]] = mapped_column(JSONType)
    summary: Mapped[dict[str, Any]] = mapped_column(JSONType)
    holdout_sha256: Mapped[str] = mapped_column(String(64))
    n_samples: Mapped[int] = mapped_column(Integer)
    fit_seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    calibrator: Mapped[CalibratorRow] = relationship(back_populates="versions")


class RegistryState(Base):
    """A single row whose generation grows with every change to which version is current.

    Each process polls it; when it moves, the process reloads the name -> current
    version map. One cheap read per poll whatever the number of calibrators.
    """

    __tablename__ = "registry_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger, default=0)


class PredictionRow(Base):
    """A prediction served with an id, so that feedback can later name it by id alone.

    Written in batches behind /calibrate (best-effort); expires after
    CALIBD_PREDICTION_TTL.
    """

    __tablename__ = "predictions"
    __table_args__ = (
        UniqueConstraint("calibrator_id", "prediction_id"),
        Index("ix_predictions_calibrator_created", "calibrator_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    prediction_id: Mapped[str] = mapped_column(String(128))
    #: Binary: the probability of class 1. Multiclass: null, see ``probabilities``.
    probability: Mapped[float | None] = mapped_column(Float, nullable=True)
    probabilities: Mapped[list[float] | None] = mapped_column(JSONType, nullable=True)
    #: Selective methods: whether the input was accepted.
    accepted: Mapped[bool | None] = mapped_column(nullable=True)
    #: The raw score (or row) that was calibrated, kept so that feedback can refit on it.
    scores: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: The row's segment values as sent ({"country": "br", ...}); labels by id inherit them.
    segments: Mapped[dict[str, str] | None] = mapped_column(JSONType, nullable=True)
    #: The row's features as sent to a feature-taking method ({"country": "br", "age": 31.0}).
    features: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class FeedbackRow(Base):
    """A labelled prediction: kept for count windows, reports and refits (with retention)."""

    __tablename__ = "feedback"
    __table_args__ = (
        Index("ix_feedback_calibrator_version_id", "calibrator_id", "version", "id"),
        # One label per prediction (the first wins); self-contained rows without an id are not constrained.
        Index("uq_feedback_calibrator_prediction", "calibrator_id", "prediction_id", unique=True),
        Index("ix_feedback_calibrator_version_predicted", "calibrator_id", "version", "predicted_at"),
        Index("ix_feedback_waiting", "calibrator_id", "predicted_at", postgresql_where=text("waiting"),
              sqlite_where=text("waiting")),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    #: No foreign key: PostgreSQL would check it per row, most of a batch's COPY. Writers hold the
    #: calibrator once a batch (repository.hold_calibrator); deleting a calibrator deletes these rows.
    calibrator_id: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)
    prediction_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    #: Binary: the probability of class 1; multiclass: the top-label confidence.
    probability: Mapped[float] = mapped_column(Float)
    label: Mapped[int] = mapped_column(Integer)
    #: Multiclass: the full row of probabilities.
    probabilities: Mapped[list[float] | None] = mapped_column(JSONType, nullable=True)
    accepted: Mapped[bool | None] = mapped_column(nullable=True)
    #: The raw score (or row) behind the probability, when known: what a refit learns from.
    scores: Mapped[Any] = mapped_column(JSONType, nullable=True)
    #: Feature-taking methods: the row's features, so that a refit can learn from them.
    features: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    #: When the prediction was served (the monitors' time axis); its receipt when unknown.
    predicted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: True while the row waits for its prediction to mature (a calibrator with a label window).
    waiting: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Waiting rows: the segment values they will be monitored under when they mature.
    segments: Mapped[dict[str, str] | None] = mapped_column(JSONType, nullable=True)


class LabelMaturityRow(Base):
    """A windowed calibrator's maturity: every prediction served up to ``matured_through`` is mature."""

    __tablename__ = "label_maturity"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    matured_through: Mapped[datetime] = mapped_column(UTCDateTime)
    late_labels: Mapped[int] = mapped_column(BigInteger, default=0)
    implied_negatives: Mapped[int] = mapped_column(BigInteger, default=0)
    unlabelled: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LabelDelayRow(Base):
    """How many labels of one value arrived with a delay in one bin (monitoring.label_delay.DELAY_EDGES)."""

    __tablename__ = "label_delays"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    label: Mapped[int] = mapped_column(Integer, primary_key=True)
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class PendingLabelRow(Base):
    """A label for an id whose prediction was not stored yet (on any replica) when the label arrived.

    Joined when the prediction is written, or by the periodic sweep of any
    process; after CALIBD_PENDING_LABEL_GRACE_SECONDS it is marked unmatched
    (counted, listed by the API, no longer joined).
    """

    __tablename__ = "pending_labels"
    __table_args__ = (UniqueConstraint("calibrator_id", "prediction_id", name="uq_pending_labels_calibrator_prediction"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"))
    prediction_id: Mapped[str] = mapped_column(String(128))
    label: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    unmatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class CloudEventHalfRow(Base):
    """One half of a KServe payload logger pair (POST /cloudevents) that waited unpaired in a
    process, so that its other half, reaching another process, pairs with it there.

    One row an id: the second half to come deletes it and logs the pair. Rows older than
    CALIBD_CLOUDEVENTS_PAIR_SECONDS are deleted (and counted as dropped).
    """

    __tablename__ = "cloudevent_halves"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    half: Mapped[str] = mapped_column(String(8))
    #: The response's scores (one per row, or rows of them); null for a request.
    scores: Mapped[Any] = mapped_column(JSONType, nullable=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class BucketSums:
    """The sums a monitor bucket keeps: windows add them up, and every metric is read from them."""

    count: Mapped[int] = mapped_column(BigInteger)
    sum_probability: Mapped[float] = mapped_column(Float)
    sum_label: Mapped[float] = mapped_column(Float)
    sum_brier: Mapped[float] = mapped_column(Float)
    sum_log_loss: Mapped[float] = mapped_column(Float)
    sum_accepted: Mapped[int] = mapped_column(BigInteger)
    count_with_acceptance: Mapped[int] = mapped_column(BigInteger)


class MonitorBucketRow(BucketSums, Base):
    """Sums over the labelled pairs of one version, one minute and one probability bin.

    Time windows add buckets up; every replica reads the same sums.
    """

    __tablename__ = "monitor_buckets"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)


class DriftStateRow(Base):
    """The drift test of one version: its state, so that it survives restarts."""

    __tablename__ = "drift_state"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    alarm: Mapped[bool] = mapped_column(default=False)
    log_evalue: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class IdempotencyRow(Base):
    """The answer already given to a request with this Idempotency-Key."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"))
    response: Mapped[dict[str, Any]] = mapped_column(JSONType)
    #: sha256 of the request body: the same key with another body is refused, not replayed.
    request_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class ApiKeyRow(Base):
    """An API key: only its sha256 is stored; the key itself is shown once, at creation."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The public part of the key (``calibd_<key_id>_<secret>``), used to find it and to revoke it.
    key_id: Mapped[str] = mapped_column(String(16), unique=True)
    key_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(JSONType)
    description: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class FitJobRow(Base):
    """An asynchronous fit (POST /calibrators?async=true) and what became of it."""

    __tablename__ = "fit_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # queued, running, succeeded, failed
    #: The calibrator's name, once the request has been read.
    calibrator: Mapped[str | None] = mapped_column(String(63), nullable=True)
    #: The process running it; it refreshes ``heartbeat_at`` while the job is alive.
    owner: Mapped[str] = mapped_column(String(32))
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    stage: Mapped[str] = mapped_column(String(64), default="queued")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    problem: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RecalibrationPolicyRow(Base):
    """A calibrator's closed-loop recalibration policy, and where its loop stands."""

    __tablename__ = "recalibration"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    policy: Mapped[dict[str, Any]] = mapped_column(JSONType)
    #: A refitted version waiting for its shadow evaluation, and the last feedback id before it.
    candidate_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    candidate_after_feedback_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_refit_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: Only one process works on a calibrator's loop at a time.
    lease_owner: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RecalibrationEventRow(Base):
    """One step of the loop: a refit, a promotion, or a candidate kept out, and why."""

    __tablename__ = "recalibration_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), index=True)
    outcome: Mapped[str] = mapped_column(String(16))  # refit, promoted, kept
    candidate_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(String(500))
    details: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SegmentDeclarationRow(Base):
    """The dimensions a calibrator monitors per segment, and how many values each tracks."""

    __tablename__ = "segment_declarations"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    dimensions: Mapped[list[str]] = mapped_column(JSONType)
    max_values: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SegmentValueRow(Base):
    """A value tracked as a segment of its own, in the order first met (``rank``); the rest pool into __OTHER."""

    __tablename__ = "segment_values"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    dimension: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer)


class SegmentMonitorBucketRow(BucketSums, Base):
    """``MonitorBucketRow`` for one segment (dimension, value) of a version."""

    __tablename__ = "segment_monitor_buckets"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    dimension: Mapped[str] = mapped_column(String(64), primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    bin: Mapped[int] = mapped_column(Integer, primary_key=True)


class SegmentFeedbackRow(Base):
    """A labelled prediction as one segment sees it (one row per dimension): the segment's count window."""

    __tablename__ = "segment_feedback"
    __table_args__ = (
        Index("ix_segment_feedback_segment", "calibrator_id", "version", "dimension", "segment", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    dimension: Mapped[str] = mapped_column(String(64))
    segment: Mapped[str] = mapped_column(String(256))
    probability: Mapped[float] = mapped_column(Float)
    label: Mapped[int] = mapped_column(Integer)
    probabilities: Mapped[list[float] | None] = mapped_column(JSONType, nullable=True)
    accepted: Mapped[bool | None] = mapped_column(nullable=True)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class SegmentDriftStateRow(Base):
    """The drift test of one segment of a version, with the share of alpha it was given."""

    __tablename__ = "segment_drift_state"

    calibrator_id: Mapped[int] = mapped_column(ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    dimension: Mapped[str] = mapped_column(String(64), primary_key=True)
    segment: Mapped[str] = mapped_column(String(256), primary_key=True)
    alpha: Mapped[float] = mapped_column(Float)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    alarm: Mapped[bool] = mapped_column(default=False)
    log_evalue: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
