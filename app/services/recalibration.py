"""Closed-loop recalibration: a policy per calibrator, and the loop that carries it out.

1. When the current version's drift alarm fires (or on a schedule), refit the
   current method on recent labelled feedback that carries raw scores, and
   store the fit as a candidate version (``promote: false``). A version fitted
   on named features (multicalibration, or auto given features) is refitted on
   the features kept with the rows (logged by /calibrate with ids, or sent with
   self-contained /feedback); rows without them are left out, and counted.
2. Score the candidate in shadow on the next labelled rows served by the
   current version (with their features, for a candidate fitted on them): it
   never saw them.
3. Promote it only if its log-loss is lower by the policy's margin with a
   paired bootstrap interval clear of zero (monitoring.recalibration);
   otherwise keep the current version and record why.

Every step is an event (GET /calibrators/{name}/recalibration, the report page)
and is counted in calibd_recalibration_total. A lease in the database makes
one app at a time work on a calibrator's loop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..calibration import CalibrationInputError, Calibrator, get_method
from ..calibration.multicalibration import MulticalibrationCalibrator
from ..monitoring.recalibration import compare_log_loss
from ..storage import recalibration as loop_store
from ..storage import repository
from ..storage.models import utcnow
from ..workers.spool import FitJob
from . import monitoring as monitoring_service
from .errors import FitFailed
from .fitting import fit_and_store
from .metrics import RECALIBRATION

if TYPE_CHECKING:
    from .container import Services

logger = logging.getLogger("calibd")


class RecalibrationPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool = True
    trigger: Literal["alarm", "schedule", "alarm_or_schedule"] = Field(
        default="alarm", description="refit when the drift alarm fires, every schedule_hours, or both"
    )
    schedule_hours: float | None = Field(default=None, gt=0, description="with a schedule trigger")
    refit_rows: int = Field(
        default=5000, ge=50, le=1_000_000,
        description="newest labelled rows (with raw scores) to refit on; a version fitted on features uses those of "
        "them that carry features",
    )
    min_refit_rows: int = Field(default=500, ge=20, description="refit only with at least this many (rows used)")
    shadow_rows: int = Field(
        default=2000, ge=50, le=1_000_000,
        description="labelled rows to score the candidate on (those with features, for a candidate fitted on them)",
    )
    margin: float = Field(default=0.001, ge=0, description="log-loss improvement per row the candidate must beat")
    level: float = Field(default=0.95, gt=0.5, lt=1, description="paired bootstrap interval level")
    n_resamples: int = Field(default=1000, ge=100, le=10_000)
    method: str | None = Field(default=None, description="default: the current version's method")
    options: dict[str, Any] | None = Field(default=None, description="default: the current version's options")


async def run_loop_once(services: Services) -> None:
    """One pass over every calibrator with an enabled policy."""
    for calibrator_id, name in await run_in_threadpool(loop_store.enabled_calibrators, services.sessions):
        state = await run_in_threadpool(loop_store.claim, services.sessions, calibrator_id, services.owner)
        if state is None:
            continue  # another process holds it
        values: dict[str, Any] = {}
        try:
            values = await _step(services, calibrator_id, name, state)
        except Exception:
            logger.exception("recalibration of %s failed; trying again next pass", name)
        finally:
            await run_in_threadpool(lambda: loop_store.release(services.sessions, calibrator_id, services.owner, **values))


async def _event(services: Services, calibrator_id: int, name: str, outcome: str, reason: str, version, details) -> None:
    await run_in_threadpool(loop_store.record_event, services.sessions, calibrator_id, outcome, reason, version, details)
    RECALIBRATION.labels(name, outcome).inc()
    logger.info("recalibration of %s: %s (%s)", name, outcome, reason)


async def _step(services: Services, calibrator_id: int, name: str, state: dict[str, Any]) -> dict[str, Any]:
    policy = RecalibrationPolicy(**state["policy"])
    current = await run_in_threadpool(repository.get_version, services.sessions, name, None)
    if state["candidate_version"] is None:
        return await _maybe_refit(services, calibrator_id, name, policy, current, state)
    return await _maybe_promote(services, calibrator_id, name, policy, current, state)


def fitted_features(calibrator: Calibrator) -> list[str] | None:
    """The named feature columns a fitted version takes: None when it was fitted without features;
    [] when fitted with features it does not name (auto that chose a method which ignores them)."""
    chosen = getattr(calibrator, "calibrator_", None)  # auto: the method it chose
    if chosen is not None and "features" not in getattr(calibrator, "arrays_", ()):
        return None
    model = chosen if chosen is not None else calibrator
    if isinstance(model, MulticalibrationCalibrator):
        return [column["name"] for column in model.model_["features"]] or None
    return [] if chosen is not None else None


def feature_columns(features: list[dict | None], names: list[str]) -> tuple[list[int], dict[str, list]]:
    """The rows (positions) whose features hold every one of ``names`` (none given: the newest row's
    columns), and those columns, column-wise as a fit or predict takes them."""
    if not names:
        names = list(next((f for f in reversed(features) if f), {}))
    keep = [i for i, row in enumerate(features) if row and all(name in row for name in names)]
    return keep, {name: [features[i][name] for i in keep] for name in names}


def _takes_features(method: str, input_kind: str, options: dict[str, Any]) -> bool:
    """Whether ``method`` with these options fits on named features."""
    try:
        spec = get_method(method).from_options(input_kind, options).fit_arrays.get("features")
    except CalibrationInputError:
        return False  # the fit request reports the bad method or options
    return spec is not None and spec.columns


async def _loaded_calibrator(services: Services, name: str, version: int) -> Calibrator:
    return (await services.calibrator(name, version)).calibrator


async def _maybe_refit(services, calibrator_id, name, policy, current, state) -> dict[str, Any]:
    now = utcnow()
    alarm = (await run_in_threadpool(monitoring_service.drift_summary, services.sessions, calibrator_id, current.version))["alarm"]
    scheduled = loop_store.due(state["last_refit_at"], policy.schedule_hours, now)
    triggered = (policy.trigger != "schedule" and alarm) or (policy.trigger != "alarm" and scheduled)
    if not triggered:
        return {}
    method = policy.method or current.method
    options = policy.options if policy.options is not None else current.parameters.get("params", {})
    options = {k: v for k, v in options.items() if k != "input"}
    # A version fitted on features is refitted on the rows' features, as /calibrate and /feedback kept them.
    names = fitted_features(await _loaded_calibrator(services, name, current.version))
    if names is not None and not _takes_features(method, current.input_kind, options):
        names = None
    rows, newest = await run_in_threadpool(
        loop_store.recent_labelled, services.sessions, calibrator_id, policy.refit_rows, names is not None
    )
    scores, labels, arrays, left_out = rows.scores, rows.labels, {}, 0
    if names is not None:
        keep, arrays["features"] = feature_columns(rows.features, names)
        left_out = len(labels) - len(keep)
        scores, labels = [scores[i] for i in keep], [labels[i] for i in keep]
    if len(labels) < policy.min_refit_rows:
        return {}  # wait for more labelled feedback with raw scores (and features)
    if current.classes is not None:
        labels = [current.classes[label] for label in labels]
    holdout = {"scores": scores, "labels": labels, **arrays, **({"classes": current.classes} if current.classes else {})}
    body = {"name": name, "method": method, "input": current.input_kind, "options": options, "promote": False, "holdout": holdout}
    why = "the drift alarm fired" if alarm and policy.trigger != "schedule" else "the schedule came round"
    try:
        candidate = await fit_and_store(services, FitJob(body=orjson.dumps(body), max_samples=services.settings.max_holdout_rows))
    except FitFailed as failed:
        await _event(services, calibrator_id, name, "kept", f"{why}, but the refit failed: {failed.detail}", None, {})
        return {"last_refit_at": now}
    details = {"trigger": why, "rows": len(labels), "method": method, "current_version": current.version,
               "feedback_ids": list(rows.ids or ()), "summary_after": candidate.summary.get("after")}
    reason = f"{why}: refitted {method} on {len(labels)} labelled rows"
    if names is not None:
        details |= {"features": list(arrays["features"]), "rows_without_features": left_out}
        reason += f" and their features ({left_out} rows without them left out)"
    await _event(services, calibrator_id, name, "refit", reason, candidate.version, details)
    return {"candidate_version": candidate.version, "candidate_after_feedback_id": newest or 0, "last_refit_at": now}


async def _maybe_promote(services, calibrator_id, name, policy, current, state) -> dict[str, Any]:
    version = state["candidate_version"]
    candidate = await _loaded_calibrator(services, name, version)
    names = fitted_features(candidate)  # a candidate fitted on features is scored with the rows' features
    rows = await run_in_threadpool(
        loop_store.shadow_rows, services.sessions, calibrator_id, current.version, state["candidate_after_feedback_id"],
        policy.shadow_rows, names is not None,
    )
    if len(rows) < policy.shadow_rows:
        return {}  # the shadow window is not full yet
    arrays: dict[str, Any] = {}
    if names is not None:
        keep, arrays["features"] = feature_columns([r[4] for r in rows], names)
        rows = [rows[i] for i in keep]
        if not rows:
            await _event(services, calibrator_id, name, "kept", f"kept version {current.version}: no shadow row carries "
                         f"the features of version {version}", version, {"current_version": current.version})
            return {"candidate_version": None, "candidate_after_feedback_id": None}
    scores = np.array([r[0] for r in rows], dtype=np.float64)
    labels = np.array([r[1] for r in rows], dtype=np.int64)
    served = np.array([r[2] for r in rows] if rows[0][3] is None else [r[3] for r in rows], dtype=np.float64)
    predicted = await run_in_threadpool(lambda: candidate.predict(scores, **arrays))
    if served.ndim == 1 and predicted.ndim == 2:
        predicted = predicted[:, 1]
    verdict = await run_in_threadpool(
        lambda: compare_log_loss(served, predicted, labels, policy.margin, policy.level, policy.n_resamples)
    )
    details = {
        "current_version": current.version, "rows": verdict.n_rows, "improvement": verdict.improvement,
        "interval": list(verdict.interval), "current_log_loss": verdict.current_log_loss,
        "candidate_log_loss": verdict.candidate_log_loss, "margin": policy.margin,
        **({"features": list(arrays["features"])} if names is not None else {}),
    }
    if verdict.promote:
        info = await run_in_threadpool(repository.promote, services.sessions, name, version)
        services.store.set_current(info.name, info.uid, info.current_version)
        await _event(services, calibrator_id, name, "promoted", verdict.reason, version, details)
    else:
        await _event(services, calibrator_id, name, "kept", f"kept version {current.version}: {verdict.reason}", version, details)
    return {"candidate_version": None, "candidate_after_feedback_id": None}
