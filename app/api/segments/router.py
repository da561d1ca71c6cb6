"""/calibrators/{name}/segments: the dimensions a calibrator monitors per segment."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...calibration import CalibrationInputError
from ...monitoring.segments import OTHER, check_declaration
from ...storage import segments as segment_store
from ..auth import REQUIRE_ADMIN, REQUIRE_READ
from ..problems import input_error
from ..state import services_of
from ..validation import NamePath, json_body, json_response, request_body
from .schemas import SegmentDeclaration, SegmentsOut

router = APIRouter(tags=["segments"])


def _out(sessions, name: str) -> dict:
    _, declared, tracked = segment_store.get_declaration(sessions, name)
    return {"calibrator": name, "declared": declared, "other": OTHER, "tracked": tracked}


@router.get(
    "/calibrators/{name}/segments",
    dependencies=[REQUIRE_READ],
    summary="The segment dimensions a calibrator monitors, and the values tracked",
    response_model=SegmentsOut,
    responses={404: {}},
)
async def get_segments(request: Request, name: NamePath) -> Response:
    return json_response(await run_in_threadpool(_out, services_of(request).sessions, name))


@router.put(
    "/calibrators/{name}/segments",
    dependencies=[REQUIRE_ADMIN],
    summary="Declare the segment dimensions to monitor and the values tracked per dimension",
    description=(
        "Values already tracked stay tracked (up to the new max_values; the rest pool into __OTHER). "
        "Segment tests already running keep their share of alpha; new ones take the new split, "
        "within what the version has left (see the README)."
    ),
    openapi_extra=request_body(("application/json", SegmentDeclaration)),
    response_model=SegmentsOut,
    responses={404: {}, 415: {}, 422: {}},
)
async def put_segments(request: Request, name: NamePath) -> Response:
    data = await json_body(request)
    try:
        declared = check_declaration(data, "body")
    except CalibrationInputError as error:
        # The body is the declaration: its fields point at the top level (/dimensions/0).
        error.field = error.field.partition(".")[2] or error.field
        raise input_error(error, ()) from None
    sessions = services_of(request).sessions

    def write() -> dict:
        segment_store.set_declaration(sessions, name, declared)
        return _out(sessions, name)

    return json_response(await run_in_threadpool(write))
