"""Request and response shapes of /evaluate (documentation: the route parses the body by hand).

Arrays are typed loosely (``list[Any]``) so that nothing validates them per
element; ``app.metrics`` validates them as numpy arrays and points at the
first bad element. Their documented schema still says what goes in them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from ...metrics import METRICS

_number = {"type": "number", "minimum": 0, "maximum": 1}
Probabilities = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "type": "array",
            "minItems": 1,
            "items": {"anyOf": [_number, {"type": "array", "items": _number, "minItems": 2}]},
            "description": "binary: the probability of class 1 per row; multiclass: rows of K probabilities "
            "summing to 1 (within 1e-3, then renormalised)",
        }
    ),
]
Labels = Annotated[
    list[Any],
    WithJsonSchema({"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}, "description": "0/1, or 0..K-1"}),
]
Weights = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "number", "minimum": 0}})]
MetricName = Literal[tuple(METRICS)]  # type: ignore[valid-type]


class BootstrapOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_resamples: int = Field(default=1000, ge=1, description="resamples; n_resamples x rows is limited")
    seed: int = Field(default=0, ge=0, description="seed of numpy's default_rng (PCG64): same seed, same intervals")
    level: float = Field(default=0.95, gt=0, lt=1, description="level of the percentile intervals (and of the Wilson intervals)")


class EvaluateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    n_bins: int | None = Field(default=15, ge=1, description="bins of the ECE family, the Brier decomposition and the diagram")
    binning: Literal["uniform", "quantile"] | None = Field(
        default="uniform", description="equal width [k/B, (k+1)/B) (last bin closed) or equal mass"
    )
    norm: Literal["l1", "l2", "max"] | None = Field(default="l1", description="ece: ECE (l1), RMSCE (l2) or MCE (max)")
    target: Literal["binary", "top_label", "classwise"] | None = Field(
        default=None, description="null: binary for a flat list, top_label for rows (classwise for ace)"
    )
    lambda_: int | None = Field(default=10, alias="lambda", ge=1, description="lp_error_*: coordinates rounded down to multiples of 1/lambda")
    bootstrap: BootstrapOptions | None = Field(default=None, description="null: no confidence intervals")


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    probabilities: Probabilities
    labels: Labels
    sample_weight: Weights | None = None
    metrics: list[MetricName] | None = Field(default=None, description="null: every metric that applies")
    options: EvaluateOptions | None = None


class MetricOut(BaseModel):
    value: float | None = Field(description="null where undefined (Spiegelhalter's Z with zero variance)")
    ci: list[float] | None = Field(description="[low, high] percentile bootstrap interval; null without options.bootstrap")
    params: dict[str, Any] = Field(description="what defines the value: bins and their convention, target, bandwidth...")
    p_value: float | None = Field(default=None, description="spiegelhalter_z only: two-sided p-value")
    decomposition: dict[str, Any] | None = Field(
        default=None, description="brier only: reliability, resolution, uncertainty and the within-bin terms"
    )


class BinOut(BaseModel):
    lower: float
    upper: float
    count: int
    weight: float | None = Field(default=None, description="with sample_weight: the bin's total weight")
    effective_count: float | None = Field(default=None, description="with sample_weight: (sum w)^2 / sum w^2")
    mean_prediction: float | None
    observed_frequency: float | None
    wilson: list[float] | None = Field(description="Wilson score interval of the observed frequency")


class ClassBins(BaseModel):
    class_: int = Field(alias="class")
    bins: list[BinOut]


class ReliabilityOut(BaseModel):
    target: str
    binning: str
    n_bins: int
    level: float
    bins: list[BinOut] | None = None
    classes: list[ClassBins] | None = Field(default=None, description="classwise target: one diagram per class")


class EvaluateResponse(BaseModel):
    metrics: dict[str, MetricOut]
    reliability: ReliabilityOut
