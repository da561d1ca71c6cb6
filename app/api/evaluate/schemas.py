"""Request and response shapes of /evaluate (documentation: the route parses the body by hand).

Arrays are typed loosely (``list[Any]``) so that nothing validates them per
element; ``calibd.metrics`` validates them as numpy arrays and points at the
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
Segments = Annotated[
    dict[str, list[Any]],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 16,
            "propertyNames": {"pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        }
    ),
]
MetricName = Literal[tuple(METRICS)]  # type: ignore[valid-type]


class BootstrapOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_resamples: int = Field(default=1000, ge=1, description="resamples; n_resamples x rows is limited")
    seed: int = Field(default=0, ge=0, description="seed of numpy's default_rng (PCG64): same seed, same intervals")
    level: float = Field(default=0.95, gt=0, lt=1, description="level of the percentile intervals (and of the Wilson intervals)")


class MulticalibrationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(default=3, ge=0, description="segments combine up to this many columns (0: the whole set only)")
    max_values: int = Field(default=3, ge=1, description="per column: its max_values - 1 most frequent values, the rest pooled into __OTHER")
    min_samples: int = Field(default=10, ge=1, description="segments with fewer rows are left out")
    max_segments: int = Field(default=1000, ge=1, description="at most this many segments (rounded up to MCGrad's chunks of 50)")


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
    segment_values: int | None = Field(
        default=50, ge=1, le=1000, description="with segments: metrics for this many most frequent values per column, the rest pooled into __OTHER"
    )
    multicalibration: MulticalibrationOptions | None = Field(default=None, description="with segments: null means MCGrad's defaults")


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    probabilities: Probabilities
    labels: Labels
    sample_weight: Weights | None = None
    metrics: list[MetricName] | None = Field(default=None, description="null: every metric that applies")
    options: EvaluateOptions | None = None
    segments: Segments | None = Field(
        default=None, description='categorical columns, one string per row: {"country": ["br", "us", ...], "device": [...]}'
    )


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


class SegmentOut(BaseModel):
    value: str = Field(description="the category, or __OTHER for the values pooled past options.segment_values")
    count: int
    weight: float | None = Field(default=None, description="with sample_weight: the segment's total weight")
    metrics: dict[str, MetricOut]


class EcceOut(BaseModel):
    values: dict[str, str] | None = Field(default=None, description="the segment: a value per column ({} for all rows)")
    count: int
    ecce: float = Field(description="Tygert's estimated cumulative calibration error (range of the cumulative differences)")
    sigma: float | None = Field(description="ECCE over its standard deviation under calibration; null where infinite")
    p_value: float
    mde: float | None = Field(
        default=None,
        description="minimum detectable error: 5 standard deviations of this segment's ECCE under calibration (MCGrad's mde); "
        "an ECCE below it cannot be told from noise in a segment this size",
    )


class MulticalibrationOut(BaseModel):
    global_: EcceOut = Field(alias="global")
    mce: float | None = Field(description="mce_sigma x the global ECCE's standard deviation (probability scale)")
    mce_sigma: float | None = Field(description="the largest segment sigma")
    mce_p_value: float = Field(description="the smallest segment p-value (not adjusted for multiplicity)")
    n_segments: int
    segments: list[EcceOut] = Field(description="MCGrad's order: all rows, then each column's values, pairs, ...")
    worst: list[EcceOut] = Field(
        default_factory=list,
        description="up to 10 segments ranked by evidence of miscalibration (largest sigma first, ties: more rows), not by raw ECCE",
    )
    params: dict[str, Any]


class EvaluateResponse(BaseModel):
    metrics: dict[str, MetricOut]
    reliability: ReliabilityOut
    segments: dict[str, list[SegmentOut]] | None = Field(default=None, description="with segments: per column, per value")
    multicalibration: MulticalibrationOut | None = Field(
        default=None, description="with segments (binary and top_label targets): ECCE per segment and the MCE, as MCGrad 0.1.5 defines them"
    )
