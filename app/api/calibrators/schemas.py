"""Request and response shapes of /calibrators.

Array fields are typed loosely here (``list[Any]``) so that pydantic checks only
the envelope; the core validates the arrays as numpy arrays, with pointers to
any bad element. Their documented schema still says what goes in them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..predictors.schemas import PredictorIn
from ..validation import MAX_VERSION, NAME_PATTERN

Numbers = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "number"}, "minItems": 1})]
Labels = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "integer", "enum": [0, 1]}, "minItems": 1})]
Name = Annotated[str, Field(pattern=NAME_PATTERN, description="lowercase letters, digits, '.', '_', '-'")]
Input = Literal["probability", "logit"]


class Holdout(BaseModel):
    """The labelled holdout. Methods that need more than scores (``features``,
    ``X``, ...) take their extra arrays here too, under their own names."""

    model_config = ConfigDict(extra="allow")

    scores: Annotated[
        list[Any],
        WithJsonSchema(
            {
                "type": "array",
                "minItems": 1,
                "items": {"oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}]},
                "description": "binary: one score per row; multiclass: rows of K scores; multivariate (bernstein): rows of M scores",
            }
        ),
    ]
    labels: Annotated[
        list[Any],
        WithJsonSchema({"type": "array", "minItems": 1, "items": {"type": ["integer", "string"]}}),
    ]
    sample_weight: Numbers | None = None
    classes: list[Any] | None = Field(
        default=None, description="class names in score-column order, when labels are strings (default: sorted)"
    )


class FitRequest(BaseModel):
    # strict: JSON types as documented (no "1" for an integer, no 1 for a boolean).
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    method: str = Field(description="a registered method, or 'auto'")
    input: Input = "probability"
    options: dict[str, Any] = Field(default_factory=dict, description="the method's options")
    promote: bool = Field(default=True, description="make the new version current")
    holdout: Holdout
    segments: dict[str, Any] | None = Field(
        default=None,
        description='segment dimensions to monitor, {"dimensions": ["country", ...], "max_values": 50}; '
        "replaces the calibrator's declaration (see PUT /calibrators/{name}/segments)",
    )
    predictor: PredictorIn | None = Field(
        default=None,
        description='the model server /v2 infer requests without scores are forwarded to, {"url": ..., "model": ..., '
        '"output": ...}; stored with the version, it replaces the calibrator\'s (see PUT /calibrators/{name}/predictor)',
    )
    labels: dict[str, Any] | None = Field(
        default=None,
        description='how labels arrive, {"window": "7d", "missing": "negative"}: window from "1s" to "90d" (s, m, h, d), '
        "or null for labels final on arrival (the default); missing: what a logged prediction without a label is at the "
        "end of its window, negative or unlabelled. Replaces the calibrator's (see PUT /calibrators/{name}/labels)",
    )


class FitUpload(BaseModel):
    """The same fit as a CSV upload (multipart/form-data)."""

    name: Name
    method: str
    input: Input = "probability"
    options: str = Field(default="{}", description="the method's options as a JSON object")
    promote: bool = True
    file: bytes = Field(
        json_schema_extra={"format": "binary"},
        description=(
            "CSV with a header row: label, score (or score_0..score_{K-1}), optionally weight; "
            "or an .npz archive whose keys use the JSON names (scores, labels, sample_weight, extra arrays)"
        ),
    )


class PromoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = Field(ge=1, le=MAX_VERSION)


class VersionOut(BaseModel):
    name: str
    version: int
    current: bool
    method: str
    input: Input
    n_classes: int
    classes: list[Any] | None
    n_samples: int
    holdout_sha256: str
    created_at: datetime
    fit_seconds: float
    summary: dict[str, Any]


class VersionDetailOut(VersionOut):
    parameters: dict[str, Any]


class VersionListItem(BaseModel):
    version: int
    current: bool
    method: str
    input: Input
    n_classes: int
    n_samples: int
    created_at: datetime


class LabelsOut(BaseModel):
    window: str | None = Field(description='how long after a prediction its label can still arrive ("7d"); null: final on arrival')
    window_seconds: float | None
    missing: str = Field(description="a logged prediction without a label at the end of its window: negative or unlabelled")


class CalibratorOut(BaseModel):
    name: str
    current_version: int | None
    latest_version: int
    created_at: datetime
    updated_at: datetime
    latest: VersionOut
    labels: LabelsOut
    versions: list[VersionListItem]


class CalibratorListItem(BaseModel):
    name: str
    current_version: int | None
    latest_version: int
    method: str | None
    n_classes: int | None
    created_at: datetime
    updated_at: datetime


class CalibratorPage(BaseModel):
    items: list[CalibratorListItem]
    next_cursor: str | None


class PromoteOut(BaseModel):
    name: str
    current_version: int
    latest_version: int


class JobProblem(BaseModel):
    status: int
    title: str
    detail: str
    errors: list[dict[str, Any]] | None = None


class JobOut(BaseModel):
    """An asynchronous fit: follow it at /jobs/{id}."""

    id: str
    state: Literal["queued", "running", "succeeded", "failed"]
    calibrator: str | None
    progress: float = Field(description="0 to 1")
    stage: str
    eta_seconds: float | None = Field(description="estimated time left, from the progress so far")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: VersionOut | None = Field(description="the stored version, once succeeded")
    problem: JobProblem | None = Field(description="why it failed, as problem details")
