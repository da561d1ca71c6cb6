"""Request and response shapes of /calibrate (documentation: the route parses by hand)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

Numbers = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "number"}, "minItems": 1})]


class CalibrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calibrator: str = Field(description="the calibrator's name")
    version: int | None = Field(default=None, ge=1, description="null: the current version")
    scores: Numbers
    ids: Annotated[
        list[Any] | None,
        WithJsonSchema({"type": ["array", "null"], "items": {"type": "string", "minLength": 1, "maxLength": 128}}),
    ] = Field(default=None, description="one id per score: the predictions are logged for feedback by id")


class CalibrateResponse(BaseModel):
    calibrator: str
    version: int
    probabilities: list[float]
    intervals: list[list[float]] | None = Field(
        default=None, description="venn_abers only: the [p0, p1] interval of each probability"
    )
