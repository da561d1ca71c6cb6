"""/calibrators/{name}/report: a version's holdout diagram and metrics, its feedback, its versions.

``format`` is json (the data), png or svg (the reliability diagram) or html
(a self-contained page with the diagram and every table).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ...reporting import render_diagram, render_page
from ...services import monitoring as monitoring_service
from ...storage import recalibration as recalibration_store
from ...storage import repository
from ..auth import REQUIRE_READ
from ..problems import Problem
from ..state import Services, services_of
from ..validation import NamePath, json_response

router = APIRouter(tags=["reports"])

MEDIA = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html; charset=utf-8"}


def build_report(services: Services, name: str, version: int | None, hours: int) -> dict[str, Any]:
    """The report's data: what the json format returns and the other formats draw."""
    info = repository.get_version(services.sessions, name, version)
    if "holdout" not in info.summary:
        raise Problem(409, f"version {info.version} has no holdout diagram (fitted by an older calibd); refit to report on it")
    calibrator = repository.get_calibrator(services.sessions, name)
    binary = info.n_classes == 2
    # One snapshot: the windows, drift tests, segments and history agree with each other.
    monitor = monitoring_service.monitor(
        services.sessions, info.calibrator_id, info.version, binary, services.settings.monitor_alpha, history_hours=hours, name=name
    )
    loop = recalibration_store.get_state(services.sessions, name)
    return {
        "calibrator": name,
        "version": info.version,
        "current_version": calibrator.current_version,
        "method": info.method,
        "input": info.input_kind,
        "n_classes": info.n_classes,
        "classes": info.classes,
        "n_samples": info.n_samples,
        "created_at": info.created_at,
        "fit": info.summary.get("fit", {}),
        "holdout": info.summary["holdout"],
        "feedback": {
            "windows": monitor["windows"],
            "history": monitor["history"],
            "drift": monitor["drift"],
            "segments": monitor["segments"],
            "labels": monitor["labels"],
        },
        "versions": [
            {
                "version": v.version,
                "method": v.method,
                "current": v.current,
                "created_at": v.created_at,
                "n_samples": v.n_samples,
                "after": v.summary.get("after"),
            }
            for v in calibrator.versions
        ],
        "recalibration": loop["events"],
        "recalibration_policy": loop["policy"],
    }


@router.get(
    "/calibrators/{name}/report",
    summary="Holdout reliability diagram and metrics, feedback windows and history, versions",
    dependencies=[REQUIRE_READ],
    responses={200: {"content": {m: {} for m in MEDIA.values()}}, 404: {}},
)
async def report(
    request: Request,
    name: NamePath,
    version: Annotated[int | None, Query(ge=1, description="default: the current version")] = None,
    format: Annotated[Literal["json", "png", "svg", "html"], Query()] = "json",
    hours: Annotated[int, Query(ge=1, le=24 * 30, description="feedback history to include")] = 48,
) -> Response:
    services = services_of(request)
    data = await run_in_threadpool(build_report, services, name, version, hours)
    if format == "json":
        return json_response(data)
    if format == "html":
        return Response(await run_in_threadpool(render_page, data), media_type=MEDIA["html"])
    holdout = data["holdout"]
    curves = {part: holdout[part]["reliability"] for part in ("before", "after")}
    ece = {part: holdout[part]["metrics"]["ece"]["value"] for part in ("before", "after")}
    title = f"{name} v{data['version']} ({data['method']})"
    body = await run_in_threadpool(render_diagram, curves, title, format, ece)
    return Response(body, media_type=MEDIA[format])
