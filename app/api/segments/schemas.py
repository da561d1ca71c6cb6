"""Shapes of a calibrator's segment declaration and of its per-segment monitors."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class SegmentDeclaration(BaseModel):
    dimensions: list[str] = Field(description="the attributes monitored per value, e.g. country and device")
    max_values: int = Field(default=50, ge=1, le=1000, description="values tracked per dimension (first come); the rest pool into __OTHER")


class SegmentsOut(BaseModel):
    calibrator: str
    declared: SegmentDeclaration | None = Field(description="null: no dimension is monitored")
    other: str = Field(description="the segment that pools values past max_values")
    tracked: dict[str, list[str]] = Field(description="per dimension, the values tracked, in the order first met")


class SegmentDriftOut(BaseModel):
    alarm: bool
    log_evalue: float
    threshold: float | None = Field(description="log(1/alpha_j): this test's share of CALIBD_MONITOR_ALPHA; null: none left")
    alpha: float
    samples: int
    batches: int
    alarm_batch: int | None
    top_alternative: str | None
    updated_at: datetime | None


class SegmentMonitorOut(BaseModel):
    dimension: str
    segment: str
    windows: dict[str, dict[str, float | None]]
    drift: SegmentDriftOut
    evidence: dict[str, str | float | None] | None = Field(
        default=None,
        description="what ranks the list: the window's ECE over its noise (sigma = ece / sqrt(brier / samples)) and the "
        "minimum detectable error (5 x that noise); the strongest evidence first",
    )
