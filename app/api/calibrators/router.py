"""/calibrators: fit, list, inspect, promote and delete calibrators."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...services import fitting
from ...storage import repository
from ...storage.repository import CalibratorInfo
from ..auth import REQUIRE_ADMIN, REQUIRE_READ
from ..bodies import media_type
from ..problems import Problem
from ..tables import ARROW_STREAM, table_body
from ..state import services_of
from ..validation import NamePath, VersionPath, json_response, read_json, request_body
from .jobs import job_out
from .fit_job import check_job_depth, check_job_rows
from ...workers.spool import FitJob, spool_json_body, spool_upload
from .schemas import (
    JobOut,
    CalibratorOut,
    CalibratorPage,
    FitRequest,
    FitUpload,
    PromoteOut,
    PromoteRequest,
    VersionDetailOut,
    VersionOut,
)
from ...services.label_timing import LabelWindow
from .upload import read_form

router = APIRouter(tags=["calibrators"])



def calibrator_out(info: CalibratorInfo) -> dict[str, Any]:
    latest = info.versions[-1]
    return {
        "name": info.name,
        "current_version": info.current_version,
        "latest_version": info.latest_version,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "latest": fitting.version_out(latest),
        "labels": LabelWindow(info.label_window_seconds, info.label_missing).as_dict(),
        "versions": [
            {key: value for key, value in fitting.version_out(v).items() if key in _LIST_FIELDS} for v in info.versions
        ],
    }


_LIST_FIELDS = {"version", "current", "method", "input", "n_classes", "n_samples", "created_at"}


@router.post(
    "/calibrators",
    status_code=201,
    dependencies=[REQUIRE_ADMIN],
    summary="Fit a calibrator and store it as the next version of its name",
    description=(
        "Answers with the stored version and a brief summary (before and after headline metrics, the fit's "
        "parameters, the timings of fit_seconds' parts); ask ?detail=full, or GET the version, for every metric and "
        "reliability bin."
    ),
    openapi_extra=table_body(request_body(("application/json", FitRequest), ("multipart/form-data", FitUpload))),
    responses={201: {"model": VersionOut}, 202: {"model": JobOut}, 413: {}, 415: {}, 422: {}},
)
async def create_calibrator(
    request: Request,
    run_async: Annotated[
        bool, Query(alias="async", description="answer 202 at once with a job to follow at /jobs/{id}")
    ] = False,
    name: Annotated[str | None, Query(description="with an Arrow IPC stream body: the fit's name", max_length=200)] = None,
    method: Annotated[str | None, Query(description="with an Arrow IPC stream body: the method", max_length=200)] = None,
    input: Annotated[str | None, Query(description="with an Arrow IPC stream body: probability or logit", max_length=20)] = None,
    options: Annotated[str | None, Query(description="with an Arrow IPC stream body: the options as JSON", max_length=10000)] = None,
    promote: Annotated[str | None, Query(description="with an Arrow IPC stream body: true or false", max_length=10)] = None,
    detail: Annotated[
        Literal["brief", "full"],
        Query(description="brief: the summary's before, after, fit and timings only; full: every metric and reliability bin"),
    ] = "brief",
) -> Response:
    kind = media_type(request.headers)
    services = services_of(request)
    limit = services.settings.max_holdout_rows
    if kind == "multipart/form-data":
        fields, file = await read_form(request, partial(spool_upload, directory=services.fit_pool.spool_dir))
        job = FitJob(fields=fields, file=file, max_samples=limit)
    elif kind in ("application/json", "") or kind.endswith("+json"):
        length = request.headers.get("content-length", "")
        job = await spool_json_body(request.stream(), int(length) if length.isdigit() else None, limit, services.fit_pool.spool_dir)
    elif kind == ARROW_STREAM:
        fields = {"name": name, "method": method, "input": input, "options": options, "promote": promote}
        length = request.headers.get("content-length", "")
        job = await spool_json_body(request.stream(), int(length) if length.isdigit() else None, limit, services.fit_pool.spool_dir)
        job = replace(job, table="arrow", fields={key: value for key, value in fields.items() if value is not None})
    else:
        raise Problem(415, f"send application/json, multipart/form-data or {ARROW_STREAM}, not {kind}")
    job = replace(job, max_decoded_bytes=services.settings.max_decoded_bytes)
    try:
        await run_in_threadpool(check_job_rows, job)
    except BaseException:  # no job to read the spooled body
        job.discard_spool()
        raise
    if run_async:
        try:
            await run_in_threadpool(check_job_depth, job)
            info = await fitting.submit(services, job, brief=detail == "brief")
        except BaseException:  # no job to read the spooled body
            job.discard_spool()
            raise
        return json_response(job_out(info), 202, headers={"Location": f"/jobs/{info.id}"})
    info = await fitting.fit_and_store(services, job)
    location = f"/calibrators/{info.name}/versions/{info.version}"
    return json_response(fitting.version_out(info, brief=detail == "brief"), 201, headers={"Location": location})


@router.get("/calibrators", summary="List calibrators, a page at a time", dependencies=[REQUIRE_READ], response_model=CalibratorPage)
async def list_calibrators(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    items, next_cursor = await run_in_threadpool(repository.list_calibrators, services_of(request).sessions, limit, cursor)
    return json_response({"items": items, "next_cursor": next_cursor})


@router.get(
    "/calibrators/{name}",
    summary="A calibrator, its latest version and its versions",
    dependencies=[REQUIRE_READ],
    response_model=CalibratorOut,
    responses={404: {}},
)
async def get_calibrator(request: Request, name: NamePath) -> Response:
    info = await run_in_threadpool(repository.get_calibrator, services_of(request).sessions, name)
    return json_response(calibrator_out(info))


@router.get(
    "/calibrators/{name}/versions/{version}",
    dependencies=[REQUIRE_READ],
    summary="One version: its fit summary and parameters",
    response_model=VersionDetailOut,
    responses={404: {}},
)
async def get_version(request: Request, name: NamePath, version: VersionPath) -> Response:
    info = await run_in_threadpool(repository.get_version, services_of(request).sessions, name, version)
    return json_response(fitting.version_out(info, with_parameters=True))


@router.post(
    "/calibrators/{name}/promote",
    dependencies=[REQUIRE_ADMIN],
    summary="Make a version current: pin it, or roll back",
    openapi_extra=request_body(("application/json", PromoteRequest)),
    response_model=PromoteOut,
    responses={404: {}},
)
async def promote(request: Request, name: NamePath) -> Response:
    body = await read_json(request, PromoteRequest)
    services = services_of(request)
    info = await run_in_threadpool(repository.promote, services.sessions, name, body.version)
    services.store.set_current(info.name, info.uid, info.current_version)
    return json_response({"name": info.name, "current_version": info.current_version, "latest_version": info.latest_version})


@router.delete(
    "/calibrators/{name}",
    status_code=204,
    summary="Delete a calibrator, all its versions and its feedback",
    dependencies=[REQUIRE_ADMIN],
    responses={404: {}},
)
async def delete_calibrator(request: Request, name: NamePath) -> Response:
    services = services_of(request)
    await run_in_threadpool(repository.delete_calibrator, services.sessions, name)
    services.store.forget(name)
    return Response(status_code=204)
