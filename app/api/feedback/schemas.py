"""Request and response shapes of /feedback and of a calibrator's monitor."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..evaluate.schemas import Segments
from ..segments.schemas import SegmentMonitorOut
from ..validation import MAX_VERSION

Labels = Annotated[
    list[Any], WithJsonSchema({"type": "array", "items": {"type": ["integer", "string"]}, "minItems": 1})
]
Probabilities = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "items": {"oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}]},
        }
    ),
]
Ids = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "string", "maxLength": 128}, "minItems": 1})]
Flags = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "boolean"}})]
Features = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "additionalProperties": {"type": "array", "items": {"type": ["string", "number", "null"]}},
        }
    ),
]


class FeedbackRequest(BaseModel):
    """Labels for logged prediction ids, or self-contained labelled probabilities."""

    model_config = ConfigDict(extra="forbid", strict=True)

    calibrator: str
    labels: Labels
    ids: Ids | None = Field(
        default=None,
        description="ids given to /calibrate: the logged predictions are labelled; with probabilities: names the rows "
        "(one label per id)",
    )
    probabilities: Probabilities | None = Field(
        default=None, description="calibrated probabilities (binary) or rows (multiclass), labelled directly"
    )
    version: int | None = Field(
        default=None, ge=1, le=MAX_VERSION, description="with probabilities: the version that made them (null: current)"
    )
    accepted: Flags | None = Field(default=None, description="with probabilities, selective methods: accepted or not")
    scores: Probabilities | None = Field(
        default=None,
        description="with probabilities: the raw scores they were calibrated from (lets closed-loop recalibration refit)",
    )
    segments: Segments | None = Field(
        default=None,
        description='segment values of the rows, column-wise: {"country": ["br", ...], "device": [...]}, each a declared '
        "dimension; with ids they override those logged by /calibrate",
    )
    features: Features | None = Field(
        default=None,
        description='with probabilities and scores, for a version fitted on features (multicalibration, or auto '
        'with features): the named features the scores were calibrated with, column-wise as /calibrate takes them '
        '({"country": ["br", ...], "age": [31, ...]}), checked against the version\'s features; kept with the rows, so '
        "that closed-loop recalibration refits on them. Labels by id inherit the features logged by /calibrate",
    )
    predicted_at: str | list[str] | None = Field(
        default=None,
        description="with probabilities: when the predictions were made (ISO 8601; one for the batch, or one per row; "
        "without an offset, UTC). With a label window the rows wait until it has passed since then; without "
        "predicted_at they are mature on arrival. Labels by id take the time their prediction was logged",
    )


class FeedbackUpload(BaseModel):
    """The same feedback as a Parquet upload (multipart/form-data)."""

    calibrator: str
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION)
    file: bytes = Field(
        json_schema_extra={"format": "binary"},
        description=(
            "Parquet with the columns label and id, or label and probability (or probability_0..probability_{K-1}), "
            "optionally accepted (booleans) and score (or score_0..)"
        ),
    )


class FeedbackReceipt(BaseModel):
    count: int = Field(description="labels recorded now (joined to their prediction, or labelled directly)")
    pending: int = Field(description="labels stored to wait for a prediction not in the log yet (their ids: unknown_ids)")
    unknown_ids: list[str] = Field(description="ids not in the prediction log yet; their labels are pending")
    expired_ids: list[str] = Field(description="ids whose prediction is older than CALIBD_PREDICTION_TTL; not recorded")
    duplicate_ids: list[str] = Field(description="ids labelled before (first label wins), or repeated in the request; not recorded")
    late_ids: list[str] | None = Field(
        default=None,
        description="calibrators with a label window only: ids whose prediction had matured (its window had passed) "
        "before the label came; counted as late, not recorded (late self-contained rows without ids are counted in "
        "calibd_late_labels_total)",
    )


class UnmatchedLabel(BaseModel):
    id: str
    label: int = Field(description="as stored: the class index (for named classes, the position in the version's classes)")
    received_at: datetime
    unmatched_at: datetime


class UnmatchedLabelsOut(BaseModel):
    calibrator: str
    grace_seconds: float = Field(description="CALIBD_PENDING_LABEL_GRACE_SECONDS")
    pending: int = Field(description="labels still within the grace period, waiting for their prediction")
    unmatched: int = Field(description="labels whose prediction was not logged within the grace period")
    labels: list[UnmatchedLabel] = Field(description="the newest unmatched labels (up to ?limit=)")


class DriftOut(BaseModel):
    alarm: bool
    log_evalue: float
    threshold: float
    samples: int
    batches: int
    alarm_batch: int | None
    top_alternative: str | None = Field(description="the alternative holding most of the evidence, e.g. shift+0.4")
    updated_at: datetime | None


class LabelsIn(BaseModel):
    """A calibrator's label settings."""

    model_config = ConfigDict(extra="forbid")

    window: str | float | None = Field(
        default=None, description='"30s", "15m", "6h", "7d" (1 s to 90 days) or seconds; null: labels are final on arrival'
    )
    missing: str = Field(default="negative", description="negative or unlabelled")


class LabelDelayOut(BaseModel):
    count: int
    p50_seconds: float | None
    p90_seconds: float | None


class LabelTimingOut(BaseModel):
    window: str | None = Field(description="the label window (null: labels are final on arrival)")
    window_seconds: float | None
    missing: str = Field(description="a logged prediction without a label at the end of its window: negative or unlabelled")
    matured_through: datetime | None = Field(description="predictions served up to this time are mature (with a window)")
    waiting_predictions: int = Field(description="logged predictions whose window has not passed yet")
    waiting_labels: int = Field(description="labels stored, waiting for their prediction to mature")
    late_labels: int = Field(description="labels that came after their prediction matured: counted, left out")
    implied_negatives: int = Field(description="logged predictions without a label at maturity, counted as negatives")
    unlabelled: int = Field(description="logged predictions without a label at maturity, left out (missing: unlabelled)")
    delays: dict[str, LabelDelayOut] = Field(description="label delay (arrival minus prediction time) by label value")
    delay_mismatch: bool = Field(description="labels final on arrival, and positives' and negatives' delays clearly differ")
    diagnostic: str | None = Field(description="what the delay mismatch means and which setting to change")


class MonitorOut(BaseModel):
    calibrator: str
    version: int
    windows: dict[str, dict[str, float | None]]
    drift: DriftOut
    labels: LabelTimingOut
    segments: list[SegmentMonitorOut] = Field(
        description="one per (dimension, value) seen, the worst calibrated first (ECE of the last_10000 window)"
    )
