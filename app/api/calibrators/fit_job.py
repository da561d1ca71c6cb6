"""A fit job as a worker runs it: parse and validate the request, then fit.

``run_fit`` is the task of the fit pool (:mod:`calibd.workers.pool`): it runs in a worker
process and returns plain values, ``{"result": ...}`` or ``{"problem": ...}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...calibration import CalibrationInputError, fit_calibrator
from ...config import Settings
from ...monitoring.label_delay import LabelSettingsError, parse_labels
from ...monitoring.segments import check_declaration
from ...workers.pool import worker_progress
from ...workers.spool import FitJob
from ..bodies import check_depth, parse_json_object
from ..limits import RowBudget
from ..problems import Problem, input_error
from ..validation import validate
from .schemas import FitRequest
from .upload import parse_arrow_fit, parse_upload

logger = logging.getLogger(__name__)


def check_job_depth(job: FitJob) -> None:
    """Refuse JSON nested too deep (400) now, not in the worker: an asynchronous fit is
    checked before it is accepted. A scan of the raw text, far cheaper than parsing."""
    if job.table is None and job.body is not None:
        check_depth(job.body)
    elif job.table is None and job.body_file is not None:
        check_depth(np.fromfile(job.body_file, dtype=np.uint8))
    if job.fields and "options" in job.fields:
        check_depth(job.fields["options"].encode(errors="surrogatepass"))


#: CALIBD_MAX_DECODED_BYTES's default, for jobs made without the setting at hand.
DEFAULT_DECODED_BYTES = Settings.model_fields["max_decoded_bytes"].default


def job_budget(job: FitJob) -> RowBudget | None:
    """The rows (and decompressed bytes) a fit's body may carry, checked before it is parsed."""
    if job.max_samples is None:
        return None
    return RowBudget(job.max_samples, "CALIBD_MAX_HOLDOUT_ROWS", job.max_decoded_bytes or DEFAULT_DECODED_BYTES)


def check_job_rows(job: FitJob) -> None:
    """Refuse a JSON body with more rows than the budget now, in the serving process (a scan of
    the raw text, run in a thread), rather than in a worker that runs at the lowest priority.
    Tables and archives are counted from their metadata where they are read (``parse_job``)."""
    budget = job_budget(job)
    if budget is None or job.table is not None:
        return
    if job.body_file is not None:
        budget.check_json_file(job.body_file)
    elif job.body is not None and len(job.body) >= 2 * budget.rows:  # fewer bytes: fewer commas than rows
        budget.check_json(job.body)


def warm_up() -> None:
    """A small fit of the usual methods in a new worker, so that the first real fit finds the
    modules imported and the code paths warm (a spawned worker imports them on first use: seconds)."""
    rng = np.random.default_rng(0)
    scores = rng.random(200)
    labels = (rng.random(200) < scores).astype(int)
    for method in ("isotonic", "platt"):
        try:
            fit_calibrator(method, "probability", {}, scores, labels, None)
        except Exception:  # a warm-up only: a real fit reports its own errors
            logger.exception("fit worker warm-up (%s) failed", method)


def run_fit(job: FitJob, progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    """Parse, validate and fit (in a worker). Returns {"result": ...} or {"problem": ...}."""
    if progress is None:
        progress = worker_progress(job.job_id)
    try:
        parse_started = time.perf_counter()
        fit, holdout, to_problem = parse_job(job)
        parse_seconds = time.perf_counter() - parse_started
        scores, labels, sample_weight, classes = (
            holdout.pop(key, None) for key in ("scores", "labels", "sample_weight", "classes")
        )
        started = time.perf_counter()
        segments = getattr(fit, "segments", None)
        if segments is not None:
            try:
                segments = check_declaration(segments)
            except CalibrationInputError as error:
                raise input_error(error, ()) from None
        labels_setting = None
        if getattr(fit, "labels", None) is not None:
            try:
                labels_setting = parse_labels(fit.labels)
            except LabelSettingsError as error:
                raise Problem.invalid(f"/labels/{error.field}" if error.field else "/labels", error.detail) from None
        try:
            result = fit_calibrator(
                fit.method, fit.input, fit.options, scores, labels, sample_weight,
                classes=classes, arrays=holdout, max_samples=job.max_samples, progress=progress,
            )
        except CalibrationInputError as error:
            raise to_problem(error) from None
        # reading the body is part of the request's fit time too
        result.summary["timings"] = {"parse": parse_seconds, **result.summary["timings"]}
        return {
            "result": {
                "name": fit.name,
                "method": fit.method,
                "input_kind": fit.input,
                "promote": fit.promote,
                "n_classes": result.calibrator.n_classes_,
                "classes": result.classes,
                "parameters": result.calibrator.to_dict(),
                "summary": result.summary,
                "holdout_sha256": result.holdout_sha256,
                "n_samples": result.n_samples,
                "fit_seconds": parse_seconds + result.fit_seconds,
                "segments": segments,
                "labels": labels_setting,
                "predictor": None if getattr(fit, "predictor", None) is None else fit.predictor.model_dump(),
                "elapsed_seconds": time.perf_counter() - started,
            }
        }
    except Problem as problem:
        return {"problem": {"status": problem.status, "detail": problem.detail, "errors": problem.errors}}


def parse_job(job: FitJob) -> tuple[FitRequest, dict[str, Any], Callable[[CalibrationInputError], Problem]]:
    """The fit request, its holdout arrays, and where a core error points, for each form of body."""
    budget = job_budget(job)
    if job.table == "arrow":
        return parse_arrow_fit(job.fields or {}, job.body_file or job.body or b"", budget)
    body = job.body
    if job.body_file is not None:
        with open(job.body_file, "rb") as spooled:
            body = spooled.read()
    if body is None:
        return parse_upload(job.fields or {}, job.file or b"", budget)
    fit = validate(FitRequest, parse_json_object(body))
    holdout = {key: getattr(fit.holdout, key) for key in ("scores", "labels", "sample_weight", "classes")}
    holdout |= fit.holdout.model_extra or {}
    return fit, holdout, lambda error: input_error(error, ("holdout",))
