"""/feedback: labels arrive after predictions; /calibrators/{name}/monitor: what they say."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...calibration import CalibrationInputError
from ...services import feedback as feedback_service
from ...services import label_timing
from ...services import monitoring as monitoring_service
from ...services.label_timing import LabelWindow
from ...services.errors import InvalidRequest
from ...services.feedback import FeedbackRequest as FeedbackInput
from ...services.feedback import JoinCounts
from ...storage import pending_labels
from ..bodies import parse_json_object, require_json
from ..limits import RowBudget
from ..observability import FEEDBACK, FEEDBACK_DUPLICATES, FEEDBACK_UNMATCHED
from ..problems import Problem, input_error
from ..tables import feedback_request, read_table_request, table_body
from ..state import services_of
from ..validation import MAX_VERSION, NamePath, json_body, json_response, request_body, validate
from ..calibrators.schemas import LabelsOut
from .schemas import FeedbackReceipt, FeedbackRequest, FeedbackUpload, LabelsIn, MonitorOut, UnmatchedLabelsOut
from ..auth import REQUIRE_ADMIN, REQUIRE_FEEDBACK, REQUIRE_READ

router = APIRouter(tags=["feedback"])


def count_joins(counts: JoinCounts) -> None:
    """Count what a background join did (labels that waited for their prediction)."""
    for name, n in counts.joined.items():
        if n:
            FEEDBACK.labels(name).inc(n)
    for name, n in counts.duplicates.items():
        if n:
            FEEDBACK_DUPLICATES.labels(name).inc(n)
    for name, n in counts.unmatched.items():
        if n:
            FEEDBACK_UNMATCHED.labels(name).inc(n)




@router.post(
    "/feedback",
    dependencies=[REQUIRE_FEEDBACK],
    status_code=202,
    summary="Record labels for logged predictions, or labelled probabilities",
    openapi_extra=table_body(request_body(("application/json", FeedbackRequest), ("multipart/form-data", FeedbackUpload))),
    responses={202: {"model": FeedbackReceipt}, 404: {}, 409: {}, 413: {}, 415: {}, 422: {}},
)
async def record_feedback(
    request: Request,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
    calibrator: Annotated[str | None, Query(description="with an Arrow IPC stream body: the calibrator", max_length=200)] = None,
    version: Annotated[int | None, Query(ge=1, le=MAX_VERSION, description="with an Arrow IPC stream body: the version")] = None,
) -> Response:
    settings = services_of(request).settings
    budget = RowBudget(settings.max_feedback_rows, "CALIBD_MAX_FEEDBACK_ROWS", settings.max_decoded_bytes)
    table = await read_table_request(request, budget)
    if table is None:
        require_json(request.headers)
        raw = await request.body()
        await budget.check_json_body(raw)  # before a Python value is made of it
        body = validate(FeedbackRequest, parse_json_object(raw))
        locate = lambda error: input_error(error, ())  # noqa: E731
    else:
        body, locate = feedback_request(*table)
    try:
        receipt = await run_in_threadpool(
            feedback_service.record, services_of(request), FeedbackInput.of(body), idempotency_key
        )
    except InvalidRequest as error:
        raise Problem.invalid(error.pointer, error.detail) from None
    except CalibrationInputError as error:
        raise locate(error) from None
    if receipt.replayed:
        return json_response(receipt.response, 202, headers={"Idempotent-Replayed": "true"})
    name = body.calibrator
    if receipt.response["count"]:
        FEEDBACK.labels(name).inc(receipt.response["count"])
    if receipt.response["duplicate_ids"]:
        FEEDBACK_DUPLICATES.labels(name).inc(len(receipt.response["duplicate_ids"]))
    return json_response(receipt.response, 202)


@router.get(
    "/calibrators/{name}/unmatched-labels",
    dependencies=[REQUIRE_READ],
    summary="Labels whose prediction never reached the log within the grace period",
    response_model=UnmatchedLabelsOut,
    responses={404: {}},
)
async def unmatched_labels(
    request: Request, name: NamePath, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> Response:
    services = services_of(request)
    found = await run_in_threadpool(pending_labels.listing, services.sessions, name, limit)
    grace = services.settings.pending_label_grace_seconds
    return json_response({"calibrator": name, "grace_seconds": grace} | found)


@router.get(
    "/calibrators/{name}/monitor",
    dependencies=[REQUIRE_READ],
    summary="The monitors of a version: window metrics and drift alarm",
    response_model=MonitorOut,
    responses={404: {}, 409: {}},
)
async def monitor(
    request: Request, name: NamePath, version: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None
) -> Response:
    services = services_of(request)
    loaded = await services.calibrator(name, version)

    answer = await run_in_threadpool(
        monitoring_service.monitor, services.sessions, loaded.calibrator_id, loaded.version, loaded.n_classes == 2,
        services.settings.monitor_alpha, name=name,
    )
    return json_response({"calibrator": name, "version": loaded.version} | answer)


@router.put(
    "/calibrators/{name}/labels",
    dependencies=[REQUIRE_ADMIN],
    summary="Declare how the calibrator's labels arrive: the label window and what a missing label is",
    description=(
        'Body: {"window": "7d", "missing": "negative"}; window from "1s" to "90d", or null for labels final on arrival. '
        "With a window, the monitors see a prediction once its window has passed since it was served, with its "
        "label, or as an implied negative (missing: negative) or left out and counted (missing: unlabelled)."
    ),
    openapi_extra=request_body(("application/json", LabelsIn)),
    response_model=LabelsOut,
    responses={404: {}, 415: {}, 422: {}},
)
async def put_labels(request: Request, name: NamePath) -> Response:
    data = await json_body(request)
    try:
        labels = LabelWindow.parse(data, at="")
    except InvalidRequest as error:
        raise Problem.invalid(error.pointer or "/", error.detail) from None
    answer = await run_in_threadpool(label_timing.set_labels, services_of(request), name, labels)
    return json_response(answer)
