"""Shapes of the inference protocol's REST messages (documentation: the infer route parses by hand)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, WithJsonSchema

from ..validation import MAX_ID_LENGTH
from .tensors import DTYPES, MAX_DIMENSIONS

Datatype = Literal[tuple(DTYPES) + ("BYTES",)]  # type: ignore[valid-type]
Shape = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=MAX_DIMENSIONS)]


class TensorParameters(BaseModel):
    binary_data_size: int | None = Field(
        default=None, ge=0, description="binary tensor data extension: this many bytes of the data after the JSON header"
    )


class InputTensor(BaseModel):
    name: str = Field(description="scores, ids (BYTES), or one of the method's arrays (features)")
    datatype: Datatype
    shape: Shape
    parameters: TensorParameters | None = Field(default=None)
    data: Annotated[list[Any] | None, WithJsonSchema({"type": "array", "description": "row-major, flat or nested"})] = None


class OutputParameters(BaseModel):
    binary_data: bool | None = Field(default=None, description="return this output as binary data")


class RequestedOutput(BaseModel):
    name: str = Field(description="probabilities, or an extra: intervals, accepted, decisions")
    parameters: OutputParameters | None = None


class RequestParameters(BaseModel):
    ids: Annotated[
        list[Any] | None,
        WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}}),
    ] = Field(default=None, description="one id per row: the predictions are logged for feedback by id")
    costs: Any = Field(default=None, description="as in /calibrate: adds the `decisions` output")
    binary_data_output: bool | None = Field(default=None, description="return every output as binary data by default")


class InferenceRequest(BaseModel):
    id: str | None = Field(default=None, description="echoed in the response")
    parameters: RequestParameters | None = None
    inputs: Annotated[list[InputTensor], Field(min_length=1)]
    outputs: list[RequestedOutput] | None = Field(default=None, description="default: every output")


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool
