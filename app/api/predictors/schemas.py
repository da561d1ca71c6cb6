"""Shapes of a calibrator's predictor (transformer mode)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...config import PredictorSetting


class PredictorIn(PredictorSetting):
    """The model server a calibrator's /v2 infer requests without ``scores`` are forwarded to."""

    model_config = ConfigDict(extra="forbid", strict=True)


class EffectivePredictor(BaseModel):
    url: str
    model: str
    output: str
    source: Literal["calibrator", "CALIBD_PREDICTORS", "CALIBD_PREDICTOR_URL"] = Field(
        description="which setting names it: the calibrator's own, else its CALIBD_PREDICTORS entry, else the default"
    )


class PredictorOut(BaseModel):
    calibrator: str
    stored: PredictorIn | None = Field(description="the predictor stored with the calibrator; null: none")
    effective: EffectivePredictor | None = Field(
        description="where its /v2 infer requests without scores go, defaults filled in; null: nowhere (they need scores)"
    )
