"""Request and response shapes of /feedback and of a calibrator's monitor."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

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


class FeedbackRequest(BaseModel):
    """Labels for logged prediction ids, or self-contained labelled probabilities."""

    model_config = ConfigDict(extra="forbid", strict=True)

    calibrator: str
    labels: Labels
    ids: Ids | None = Field(default=None, description="ids given to /calibrate; the logged predictions are labelled")
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
    count: int
    unknown_ids: list[str]
    expired_ids: list[str]


class DriftOut(BaseModel):
    alarm: bool
    log_evalue: float
    threshold: float
    samples: int
    batches: int
    alarm_batch: int | None
    top_alternative: str | None = Field(description="the alternative holding most of the evidence, e.g. shift+0.4")
    updated_at: datetime | None


class MonitorOut(BaseModel):
    calibrator: str
    version: int
    windows: dict[str, dict[str, float | None]]
    drift: DriftOut
