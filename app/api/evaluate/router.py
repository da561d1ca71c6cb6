"""/evaluate: calibration metrics of given probabilities and labels. Stores nothing.

Parsed by hand with orjson, like /calibrate: the arrays go to
``calibd.metrics.evaluate`` as parsed lists and are validated there as numpy
arrays, so a bad element comes back as a 422 pointing at it
(``/probabilities/3/1``, ``/labels/7``, ``/options/n_bins``, ``/metrics/2``,
``/segments/country/5``).
The computation runs in the thread pool.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...calibration import CalibrationInputError
from ...metrics import evaluate as evaluate_metrics
from ..bodies import parse_json_object, require_json
from ..limits import RowBudget
from ..problems import Problem, input_error
from ..state import services_of
from ..validation import json_response, request_body
from .schemas import EvaluateRequest, EvaluateResponse
from ..auth import REQUIRE_READ

router = APIRouter(tags=["evaluate"])

_FIELDS = frozenset(EvaluateRequest.model_fields)

#: n_resamples x rows of one request's bootstrap (about 10 s of work for 10,000 rows and 1,000 resamples).
MAX_BOOTSTRAP_ROWS = 10_000_000


@router.post(
    "/evaluate",
    dependencies=[REQUIRE_READ],
    summary="Compute calibration metrics and reliability-diagram data (stores nothing)",
    openapi_extra=request_body(("application/json", EvaluateRequest)),
    responses={200: {"model": EvaluateResponse}, 400: {}, 413: {}, 415: {}, 422: {}},
)
async def evaluate(request: Request) -> Response:
    require_json(request.headers)
    raw = await request.body()
    settings = services_of(request).settings
    budget = RowBudget(settings.max_holdout_rows, "CALIBD_MAX_HOLDOUT_ROWS", settings.max_decoded_bytes)
    await budget.check_json_body(raw)  # before a Python value is made of it
    data = parse_json_object(raw)
    unknown = data.keys() - _FIELDS
    if unknown:
        raise Problem.invalid(f"/{sorted(unknown)[0]}", "unknown field")
    for field in ("probabilities", "labels"):
        if data.get(field) is None:
            raise Problem.invalid(f"/{field}", "required: a list")
    try:
        result = await run_in_threadpool(
            evaluate_metrics,
            data["probabilities"],
            data["labels"],
            data.get("sample_weight"),
            data.get("metrics"),
            data.get("options"),
            max_bootstrap_rows=MAX_BOOTSTRAP_ROWS,
            segments=data.get("segments"),
        )
    except CalibrationInputError as error:
        raise input_error(error, ()) from None
    return json_response(result)
