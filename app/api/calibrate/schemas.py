"""Request and response shapes of /calibrate (documentation: the route parses by hand)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ..validation import MAX_VERSION

Numbers = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "number"}, "minItems": 1})]
Scores = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "items": {"oneOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}]},
            "description": "binary: one score per prediction; multiclass: rows of K scores; multivariate: rows of M",
        }
    ),
]
Costs = Annotated[
    Any,
    WithJsonSchema(
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"false_positive": {"type": "number"}, "false_negative": {"type": "number"}},
                    "required": ["false_positive", "false_negative"],
                    "additionalProperties": False,
                },
                {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            ],
            "description": "binary: the cost of each error; multiclass: C[true][decided]",
        }
    ),
]


class CalibrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    calibrator: str = Field(description="the calibrator's name")
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION, description="null: the current version")
    scores: Scores
    ids: Annotated[
        list[Any] | None,
        WithJsonSchema({"type": ["array", "null"], "items": {"type": "string", "minLength": 1, "maxLength": 128}}),
    ] = Field(default=None, description="one id per score: the predictions are logged for feedback by id")
    costs: Costs | None = Field(default=None, description="return `decisions` of least expected cost")
    features: Annotated[
        list[Any] | dict[str, Any] | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    {
                        "type": "object",
                        "propertyNames": {"pattern": "^[A-Za-z0-9_-]{1,64}$"},
                        "additionalProperties": {"type": "array", "items": {"type": ["string", "number", "null"]}},
                    },
                    {"type": "null"},
                ]
            }
        ),
    ] = Field(
        default=None,
        description="selective calibrators: one feature row per score; multicalibration: named columns, one value per "
        "score (strings: categorical, numbers or null: numeric), as at fit time",
    )


class CalibrateResponse(BaseModel):
    calibrator: str
    version: int
    probabilities: list[float] | list[list[float]] = Field(
        description="binary: the probability of class 1; multiclass: rows in the order of `classes` (or 0..K-1)"
    )
    classes: list[Any] | None = Field(default=None, description="the class of each column, when fitted on class names")
    intervals: list[list[float]] | None = Field(
        default=None, description="venn_abers only: the [p0, p1] interval of each probability"
    )
    accepted: list[bool] | None = Field(default=None, description="selective only: whether each input is accepted")
    decisions: list[Any] | None = Field(default=None, description="with costs: the decision of least expected cost")
