"""create_app(): the FastAPI application factory."""

from __future__ import annotations

import asyncio
import inspect
import logging
from contextlib import asynccontextmanager
from datetime import timedelta

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from . import __version__
from .api import (
    calibrate, calibrators, evaluate, feedback, health, inference, keys, observability, predictors, problems, recalibration,
    reports, segments, transfer,
)
from .api import cloudevents
from .api.edge import EdgeFirst
from .api.calibrators.fit_job import run_fit, warm_up
from .workers.pool import FitPool, init_background_worker
from .workers.side_process import SideProcess, shares_database
from .api.inference import transformer
from .api.feedback.router import count_joins
from .api.logs import configure_logging, flush_logs
from .api import monitor_exposition
from .api.observability import PREDICTION_LOG_DROPPED, flush_request_metrics, make_registry
from .api.state import Services
from .config import Settings, get_settings
from .services import cloudevents as cloudevents_service
from .services import feedback as feedback_service
from .services import fitting
from .services import recalibration as recalibration_service
from .services import label_timing
from .services.monitoring import DriftSettings
from .storage import retention
from .storage.cache import CalibratorStore
from .storage.db import make_engine, make_sessionmaker, make_side_engine
from .storage.jobs import sweep_interrupted
from .storage.keys import KeyRing
from .storage.models import utcnow
from .storage.prediction_log import PredictionLog

logger = logging.getLogger("calibd")
#: How long a stop waits for the periodic jobs' runs under way to end.
STOP_SECONDS = 5.0


async def _every(stopping: asyncio.Event, seconds: float, job, what: str) -> None:
    """Run ``job`` every ``seconds`` until ``stopping`` is set: awaited if it is a coroutine function,
    else in a worker thread. A failure (the database restarting, say) is logged, and the job runs
    again next time. A run under way when ``stopping`` is set ends first: cancelled, its awaited
    thread would run on and what the job does after that await (log the pairs a commit took) never."""
    while not stopping.is_set():
        try:
            if inspect.iscoroutinefunction(job):
                await job()
            else:
                await run_in_threadpool(job)
        except Exception as error:
            logger.warning("%s failed: %s", what, error)
        try:
            await asyncio.wait_for(stopping.wait(), seconds)
        except TimeoutError:
            pass


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if settings.json_logs:
        configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = make_engine(settings.database_url)
        sessions = make_sessionmaker(engine)
        # Engines of their own, with short timeouts: neither /metrics nor /readyz waits for, or
        # takes, a connection of the routes that write. /metrics reads in a process of its own.
        probe_engine = make_side_engine(settings.database_url, settings.readiness_timeout_seconds)
        monitor_reader = monitor_exposition.reader(settings.database_url, settings.metrics_timeout_seconds, sessions)
        metrics_registry, monitor_collector = make_registry(monitor_reader, settings.metrics_timeout_seconds)
        store = CalibratorStore(sessions, settings.calibrator_cache_bytes)
        drift = DriftSettings(settings.monitor_alpha, settings.monitor_tolerance)
        pending_join = feedback_service.PendingJoin(
            drift,
            settings.prediction_ttl,
            timedelta(seconds=settings.pending_label_grace_seconds),
        )
        prediction_log = PredictionLog(
            sessions, settings.prediction_log_queue, lambda name, n: PREDICTION_LOG_DROPPED.labels(name).inc(n),
            join=lambda session: feedback_service.join_pending(session, pending_join), on_join=count_joins,
        )
        keyring = KeyRing(sessions, settings.bootstrap_admin_key)
        try:
            await run_in_threadpool(keyring.refresh)
        except Exception as error:  # start anyway: cached calibrators can be served once loaded
            logger.warning("could not read API keys at start (retrying): %s", error)
        app.state.services = Services(
            settings=settings,
            engine=engine,
            sessions=sessions,
            store=store,
            prediction_log=prediction_log,
            metrics_registry=metrics_registry,
            monitor_collector=monitor_collector,
            probe_engine=probe_engine,
            keyring=keyring,
            fit_pool=FitPool(settings.fit_workers, settings.fit_timeout_seconds, settings.spool_dir, task=run_fit, warm_up=warm_up),
        )

        app.state.services.fit_pool.start()
        app.state.predictor_client = predictor_client = transformer.make_client(settings)
        grpc_server = None
        if settings.grpc_port is not None:  # the inference protocol over gRPC, in this event loop
            from .api.inference import grpc_service

            grpc_server, app.state.grpc_port = await grpc_service.start(
                app, settings.grpc_host, settings.grpc_port, settings.max_body_bytes
            )

        def purge() -> None:
            retention.purge(sessions, utcnow(), settings.prediction_ttl, settings.feedback_retention)

        async def flush_prediction_log() -> None:
            await cloudevents_service.flush(app.state.services)  # pairs of POST /cloudevents, calibrated at once
            entries = prediction_log.take()
            if entries:
                await run_in_threadpool(prediction_log.write, entries)

        def sweep_pending_labels() -> None:
            # Every process sweeps: a label may reach a replica other than the one whose log holds its prediction.
            count_joins(feedback_service.sweep_pending(sessions, pending_join))

        # Every serving process may mature: each batch holds its calibrator's maturity row.
        maturity_process = None
        if shares_database(settings.database_url):
            maturity_process = SideProcess(label_timing.__name__, init_background_worker)

        def mature_predictions() -> None:
            if not label_timing.has_work(sessions):
                return
            if maturity_process is None:  # an in-memory SQLite database: only this process sees it
                label_timing.mature(sessions, drift)
            else:
                maturity_process.call(label_timing.mature_database, settings.database_url, drift)

        async def flush_pending_metrics() -> None:  # a coroutine: it runs in the loop's thread, no wake-up
            flush_request_metrics()

        async def recalibrate() -> None:
            await recalibration_service.run_loop_once(app.state.services)

        def poll_registry_and_keys() -> None:
            # One worker-thread wake-up per interval, not one for each: while a waking
            # thread waits for the GIL, each GIL release of the event loop pays to wake it.
            try:
                store.refresh()
            finally:
                keyring.refresh()

        stopping = asyncio.Event()
        tasks = [
            asyncio.create_task(_every(stopping, *job))
            for job in (
                (settings.version_poll_seconds, poll_registry_and_keys, "registry and key poll"),
                (0.2, flush_prediction_log, "prediction log write"),
                (settings.metrics_flush_seconds, flush_pending_metrics, "request metrics flush"),
                (600, purge, "retention purge"),
                (settings.pending_label_sweep_seconds, sweep_pending_labels, "pending label sweep"),
                (settings.label_maturity_seconds, mature_predictions, "label maturity"),
                (10, lambda: sweep_interrupted(sessions), "fit job sweep"),
                (settings.recalibration_interval_seconds, recalibrate, "recalibration pass"),
            )
        ]
        try:
            yield
        finally:
            stopping.set()
            _, stuck = await asyncio.wait(tasks, timeout=STOP_SECONDS)
            for task in stuck:  # a job waiting on a database that does not answer
                task.cancel()
            if grpc_server is not None:
                await grpc_server.stop(grace=5)
            await predictor_client.close()
            await fitting.interrupt_all(app.state.services)
            try:  # what waits unpaired here goes to the database, for another replica to pair
                await cloudevents_service.flush(app.state.services, everything=True)
            except Exception as error:
                logger.warning("cloudevents flush at shutdown failed: %s", error)
            await run_in_threadpool(prediction_log.write, prediction_log.take())
            app.state.services.fit_pool.close()
            if maturity_process is not None:
                maturity_process.close()
            monitor_reader.close()
            for each in (engine, probe_engine):
                each.dispose()
            flush_request_metrics()
            flush_logs()

    app = EdgeFirst(
        title="calibd",
        version=__version__,
        summary="Fit, store and serve calibrators for classifier scores.",
        lifespan=lifespan,
        # calibd's telemetry is its Prometheus metrics and access log. FastAPI's own OpenTelemetry
        # (0.165+; older versions keep the keyword as an extra) would look up the tracer, meter and
        # logger providers on every request: a twentieth of a /calibrate request's CPU.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    problems.install(app)
    for module in (
        # Routes are matched router by router, in this order: the serving routes come early.
        calibrators, calibrators.jobs, calibrate, inference, feedback, evaluate, reports, recalibration, transfer, keys,
        health, observability, segments, predictors, cloudevents,
    ):
        app.include_router(module.router)
    # One layer in front of everything: request id, body limit, duration histogram, access line;
    # and the shortcut to the routes served by plain ASGI endpoints (/calibrate).
    app.put_edge_in_front(settings.max_body_bytes)
    return app
