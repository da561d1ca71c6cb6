"""/calibrators/{name}/import: store an exported calibrator as a new version, without refitting.

An export (``calibd export``, ``Client.export``) is the JSON of one stored
version: a format marker, the method, input, classes, the parameters exactly
as ``Calibrator.to_dict`` wrote them, the fit summary and the holdout's
digest. Exports need no route of their own: they are read from
``GET /calibrators/{name}/versions/{version}``.

An import is checked before anything is written: the body is parsed as plain
JSON (never code), the parameters are rebuilt with
``calibd.calibration.from_dict``, their learned state must pass the checks every
fit's output passes (``Calibrator.check_state``: finite numbers, thresholds in
order, probabilities within [0, 1], shapes that agree with each other and with
the number of classes; a 422 names the field), their method, input and number
of classes must agree with the document's, and the rebuilt calibrator must turn
a few probe scores into finite probabilities. The version is then stored as it was
exported, so it gives exactly the outputs it gave where it came from.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..calibration import CalibrationInputError, Calibrator, from_dict
from ..services.fitting import version_out
from ..storage import repository
from .auth import REQUIRE_ADMIN
from .calibrators.schemas import VersionOut
from .problems import Problem, input_error
from .state import services_of
from .validation import NamePath, json_response, read_json, request_body

router = APIRouter(tags=["calibrators"])

#: The value of ``format`` in every export, and the version of its layout.
EXPORT_FORMAT = "calibd-calibrator"
EXPORT_FORMAT_VERSION = 1
#: Most score columns a probed calibrator may declare (the probe is 5 rows of that many).
MAX_COLUMNS = 100_000


class ExportedCalibrator(BaseModel):
    """One stored calibrator version as portable JSON (what ``calibd export`` writes)."""

    model_config = ConfigDict(extra="allow")  # provenance fields (name, version, created_at...) are kept as written

    format: Literal["calibd-calibrator"] = Field(description="marks the document as a calibd export")
    format_version: Literal[1] = Field(description="the layout of the document")
    method: str = Field(max_length=64)
    input: Literal["probability", "logit"]
    n_classes: int = Field(ge=2, le=MAX_COLUMNS)
    classes: list[str | int] | None = Field(default=None, max_length=MAX_COLUMNS)
    parameters: dict[str, Any] = Field(description="the calibrator as Calibrator.to_dict wrote it (plain JSON)")
    summary: dict[str, Any] = Field(default_factory=dict, description="the fit summary (before/after metrics, holdout diagram)")
    holdout_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    n_samples: int = Field(ge=0, le=2**31 - 1)
    fit_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)


def _probe_scores(calibrator: Calibrator) -> np.ndarray:
    """A few valid scores of the shape and kind the calibrator takes."""
    logit = calibrator.input == "logit"
    if getattr(calibrator, "n_classes_", 2) == 2 and "binary" in calibrator.tasks:
        return np.array([-4.0, -1.0, 0.0, 1.0, 4.0]) if logit else np.array([0.01, 0.25, 0.5, 0.75, 0.99])
    columns = int(calibrator.n_columns_)
    if not 1 <= columns <= MAX_COLUMNS:
        raise ValueError(f"the parameters declare {columns} score columns (at most {MAX_COLUMNS})")
    if logit:
        return np.linspace(-2.0, 2.0, 5)[:, None] * np.linspace(-1.0, 1.0, columns)[None, :]
    rows = np.full((5, columns), 0.5 / columns)  # the uniform row, then rows leaning to one class each
    rows[0] = 1.0 / columns
    rows[np.arange(1, 5), np.arange(1, 5) % columns] += 0.5
    return rows


def _rebuild(export: ExportedCalibrator) -> Calibrator:
    """The calibrator the parameters describe, checked against the document; a 422 if they do not load."""
    parameters = export.parameters

    def refuse(at: str, detail: str) -> Problem:
        return Problem.invalid(at, detail)

    if parameters.get("method") != export.method:
        raise refuse("/parameters/method", f"must equal the document's method {export.method!r}")
    try:
        calibrator = from_dict(parameters)
        calibrator._validate_params()
    except Exception as error:  # untrusted data: any failure to load is the sender's
        raise refuse("/parameters", f"the parameters do not load as a {export.method} calibrator: {_reason(error)}") from None
    try:
        calibrator.check_state()  # what every fit's output passes
    except CalibrationInputError as error:
        raise state_problem(error) from None
    except Exception as error:
        raise refuse("/parameters/state", f"the learned state is not usable: {_reason(error)}") from None
    if calibrator.input != export.input:
        raise refuse("/input", f"the parameters are of a calibrator for input {calibrator.input!r}")
    if int(getattr(calibrator, "n_classes_", 2)) != export.n_classes:
        raise refuse("/n_classes", f"the parameters are of a calibrator for {calibrator.n_classes_} classes")
    if export.classes is not None and len(export.classes) != export.n_classes:
        raise refuse("/classes", f"has {len(export.classes)} names for {export.n_classes} classes")
    required = [name for name, spec in getattr(calibrator, "predict_arrays", {}).items() if spec.required]
    if not required:  # a method that needs extra arrays to predict cannot be probed without them
        try:
            probabilities = np.asarray(calibrator.predict(_probe_scores(calibrator)), dtype=np.float64)
        except Exception as error:
            raise refuse("/parameters", f"the calibrator fails on probe scores: {_reason(error)}") from None
        if not (np.all(np.isfinite(probabilities)) and np.all((probabilities >= 0) & (probabilities <= 1))):
            raise refuse("/parameters", "the calibrator turns probe scores into values that are not probabilities")
    return calibrator


def state_problem(error: CalibrationInputError) -> Problem:
    """A 422 at the place in ``parameters`` that a state check names: ``state.y_thresholds_``
    and index 3 is /parameters/state/y_thresholds_/3; ``n_classes`` is /parameters/n_classes."""
    return input_error(error, ("parameters",), {"input": ("parameters", "params", "input"), "options": ("parameters", "params")})


def _reason(error: Exception) -> str:
    text = getattr(error, "detail", None) or str(error) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class ImportedOut(VersionOut):
    imported: dict[str, Any] = Field(description="where the version came from, as the export says")


@router.post(
    "/calibrators/{name}/import",
    status_code=201,
    dependencies=[REQUIRE_ADMIN],
    summary="Store an exported calibrator as the next version of a name, without refitting",
    openapi_extra=request_body(("application/json", ExportedCalibrator)),
    responses={201: {"model": ImportedOut}, 413: {}, 415: {}, 422: {}},
)
async def import_calibrator(
    request: Request,
    name: NamePath,
    promote: Annotated[bool, Query(description="make the imported version current")] = True,
) -> Response:
    export = await read_json(request, ExportedCalibrator)
    await run_in_threadpool(_rebuild, export)
    provenance = {
        key: value
        for key, value in (export.model_extra or {}).items()
        if key in ("name", "version", "created_at", "exported_at", "calibd_version") and _is_scalar(value)
    }
    summary = dict(export.summary)
    summary["imported"] = provenance
    services = services_of(request)
    info = await run_in_threadpool(
        lambda: repository.create_version(
            services.sessions,
            name=name,
            method=export.method,
            input_kind=export.input,
            n_classes=export.n_classes,
            classes=export.classes,
            parameters=export.parameters,
            summary=summary,
            holdout_sha256=export.holdout_sha256,
            n_samples=export.n_samples,
            fit_seconds=export.fit_seconds,
            promote=promote,
        )
    )
    services.store.stored(info)
    location = f"/calibrators/{info.name}/versions/{info.version}"
    return json_response(version_out(info) | {"imported": provenance}, 201, headers={"Location": location})


def _is_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (str, int, bool, datetime)) or value is None
