"""Operations: request ids, JSON logs, size limits, and answers while the database is away."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np

from calibd.api.logs import BackgroundStreamHandler
from calibd.config import Settings

from .conftest import REPO, LiveServer, free_port


def test_request_ids_are_echoed_or_assigned(client):
    given = client.get("/healthz", headers={"X-Request-ID": "trace-42"})
    assert given.headers["X-Request-ID"] == "trace-42"
    assigned = client.get("/healthz").headers["X-Request-ID"]
    assert len(assigned) == 32
    hostile = client.get("/healthz", headers={"X-Request-ID": "x" * 500}).headers["X-Request-ID"]
    assert hostile != "x" * 500 and len(hostile) == 32


def test_batch_and_holdout_limits_are_stated(database_url, name):
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=40)
    labels = (rng.uniform(size=40) < scores).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    with LiveServer(Settings(database_url=database_url, max_holdout_rows=30, max_batch_scores=5)) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            refused = http.post("/calibrators", json=body)
            assert refused.status_code == 422
            assert refused.json()["errors"][0]["pointer"] == "/holdout/scores"
            assert "at most 30" in refused.json()["detail"]
            body["holdout"] = {"scores": scores[:25].tolist(), "labels": labels[:25].tolist()}
            assert http.post("/calibrators", json=body).status_code == 201
            too_many = http.post("/calibrate", json={"calibrator": name, "scores": [0.5] * 6})
            assert too_many.status_code == 422 and "CALIBD_MAX_BATCH_SCORES" in too_many.json()["detail"]
            assert http.post("/calibrate", json={"calibrator": name, "scores": [0.5] * 5}).status_code == 200


def test_method_limits_are_stated():
    from calibd.calibration import CalibrationInputError, fit_calibrator

    try:
        fit_calibrator("platt", "probability", {}, [0.5] * 20, [0, 1] * 10, max_samples=12)
    except CalibrationInputError as error:
        assert error.field == "scores" and "at most 12" in error.detail
    else:
        raise AssertionError("the limit was not enforced")


def test_without_the_database_writes_get_503_and_liveness_holds(tmp_path):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/none?connect_timeout=1"
    with LiveServer(Settings(database_url=url)) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "Retry-After" in ready.headers
        for method, path, body in (
            ("POST", "/calibrators", {"name": "x", "method": "platt", "holdout": {"scores": [0.5], "labels": [1]}}),
            ("POST", "/feedback", {"calibrator": "x", "probabilities": [0.5], "labels": [1]}),
            ("GET", "/calibrators", None),
        ):
            response = http.request(method, path, json=body)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["Retry-After"] == "5"
            assert response.headers["content-type"] == "application/problem+json"


def test_logs_are_json_lines_with_the_request_id(tmp_path):
    port = free_port()
    env = os.environ | {"CALIBD_DATABASE_URL": f"sqlite:///{tmp_path / 'logs.db'}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "calibd.cli", "serve", "--port", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        httpx.post(f"http://127.0.0.1:{port}/calibrate", json={"calibrator": "nope", "scores": [0.5]},
                   headers={"X-Request-ID": "find-me-7"})
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=90)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert lines, stderr
    access = [line for line in lines if line.get("request_id") == "find-me-7"]
    assert access and access[-1]["status"] == 404 and access[-1]["route"] == "/calibrate"
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    # Lines logged while shutting down are written too, though uvicorn ends the process by SIGTERM.
    assert any(line["message"].startswith("Finished server process") for line in lines), stderr


def _logger_writing_to(stream: io.StringIO, capacity: int) -> tuple[logging.Logger, BackgroundStreamHandler]:
    handler = BackgroundStreamHandler(stream, capacity=capacity)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(f"calibd.test-writer-{id(stream)}")
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    return logger, handler


def test_the_log_writer_keeps_order_bounds_its_queue_and_flushes_everything():
    stream = io.StringIO()
    logger, handler = _logger_writing_to(stream, capacity=50)
    for i in range(120):
        logger.info("line %d", i)
    written = stream.getvalue().splitlines()
    # At most capacity - 1 lines wait; the caller writes them itself beyond that.
    assert len(written) >= 120 - 49 and written == [f"line {i}" for i in range(len(written))]
    handler.flush()
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(120)]


def test_the_log_writer_loses_nothing_from_concurrent_threads():
    stream = io.StringIO()
    logger, handler = _logger_writing_to(stream, capacity=100)

    def emit(thread: int) -> None:
        for i in range(500):
            logger.info("%d %d", thread, i)

    threads = [threading.Thread(target=emit, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.3)  # one writer pass in between, as in service
    handler.flush()
    lines = [tuple(map(int, line.split())) for line in stream.getvalue().splitlines()]
    assert len(lines) == 2000
    for t in range(4):
        assert [i for thread, i in lines if thread == t] == list(range(500))


def test_a_forked_child_writes_its_own_lines_and_not_its_parents():
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stream:
        logger, handler = _logger_writing_to(stream, capacity=100)
        logger.info("parent, queued before the fork")
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            logger.info("child")
            handler.flush()
            os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        logger.info("parent, after the fork")
        handler.flush()
    with os.fdopen(read_end) as pipe:
        lines = pipe.read().splitlines()
    assert sorted(lines) == ["child", "parent, after the fork", "parent, queued before the fork"]


def test_a_fit_past_its_timeout_is_stopped_and_the_service_carries_on(database_url, name, row_counts):
    rng = np.random.default_rng(1)
    scores = rng.uniform(size=300_000)
    labels = (rng.uniform(size=300_000) < scores).astype(int)
    slow = {"name": name, "method": "auto", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    small = {"name": name, "method": "platt", "holdout": {"scores": scores[:200].tolist(), "labels": labels[:200].tolist()}}
    before = row_counts()
    with LiveServer(Settings(database_url=database_url, fit_timeout_seconds=1.0)) as live:
        with httpx.Client(base_url=live.url, timeout=120) as http:
            stopped = http.post("/calibrators", json=slow)
            assert stopped.status_code == 503 and "CALIBD_FIT_TIMEOUT_SECONDS" in stopped.json()["detail"]
            assert row_counts() == before
            assert http.get("/healthz").status_code == 200
            again = http.post("/calibrators", json=small)
            assert again.status_code == 201, again.text  # a fresh worker takes over
