"""Helpers shared by the routers: pydantic validation with pointers, JSON responses."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Path, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from ..services.errors import InvalidRequest
from ..services.feedback import MAX_ID_LENGTH, check_id_strings  # noqa: F401 (MAX_ID_LENGTH: the schemas import it from here)
from .bodies import parse_json_object, require_json
from .problems import Problem, pointer

Model = TypeVar("Model", bound=BaseModel)

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
#: The largest version number: versions are 32-bit integers in the database.
MAX_VERSION = 2**31 - 1
#: The longest prediction id (/calibrate's and /feedback's ``ids``, the inference protocol's).
def check_ids(ids: Any, at: str = "/ids") -> None:
    """Prediction ids: a list of non-empty strings of at most MAX_ID_LENGTH characters, without NUL."""
    if not isinstance(ids, list):
        raise Problem.invalid(at, "must be a list of strings")
    try:
        check_id_strings(ids, at)
    except InvalidRequest as error:
        raise Problem.invalid(error.pointer, error.detail) from None

#: The path parameters of /calibrators/{name}/...: every resource of a calibrator takes them.
NamePath = Annotated[str, Path(pattern=NAME_PATTERN)]
VersionPath = Annotated[int, Path(ge=1, le=MAX_VERSION)]


def validate(model: type[Model], data: Any, prefix: tuple[str | int, ...] = ()) -> Model:
    """``model.model_validate(data)``, with failures as a 422 listing every bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        errors = [
            {"pointer": pointer(*prefix, *e["loc"]), "detail": _message(e)}
            for e in error.errors(include_url=False)
        ]
        raise Problem(422, "; ".join(f"{e['pointer'] or '/'}: {e['detail']}" for e in errors), errors) from None


def _message(error: dict[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "string_pattern_mismatch" and error["loc"][-1:] == ("name",):
        return "must match ^[a-z0-9][a-z0-9._-]{0,62}$ (lowercase letters, digits, '.', '_', '-'; at most 63)"
    return error["msg"]


def json_response(data: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialise with orjson, numpy arrays and datetimes included."""
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )


def request_body(*content: tuple[str, type[BaseModel]]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for routes that read their body themselves: (media type, model) pairs."""
    return {
        "requestBody": {
            "required": True,
            "content": {media: {"schema": inline_schema(model)} for media, model in content},
        }
    }


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` substituted in place."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


async def json_body(request: Request) -> dict[str, Any]:
    """A JSON request's body, an object: 415 for another content type, 400 for malformed JSON."""
    require_json(request.headers)
    return parse_json_object(await request.body())


async def read_json(request: Request, model: type[Model]) -> Model:
    """A JSON request's body validated as ``model`` (415, 400, or 422 listing every bad field)."""
    return validate(model, await json_body(request))
