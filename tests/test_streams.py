"""`calibd consume`: labels from a Redis stream, each counted exactly once, whatever crashes.

A real Redis (CALIBD_TEST_REDIS_URL, which .ci/run sets; default the local one) and the real
app over HTTP. Each test uses its own stream key, so parallel runs do not collide.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from sqlalchemy import text

from calibd.storage.db import make_engine

from .conftest import fit_platt_over_http
from .monitors import assert_same_monitors, monitor

redis = pytest.importorskip("redis")

REDIS_URL = os.environ.get("CALIBD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="module")
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        if os.environ.get("CI"):
            pytest.fail(f"Redis does not answer at {REDIS_URL} (.ci/run starts one)")
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    yield client
    client.close()


@pytest.fixture
def stream(redis_client):
    key = f"calibd-test:{uuid.uuid4().hex}"
    yield key
    redis_client.delete(key, f"{key}:dead-letter")


def log_predictions(http: httpx.Client, name: str, scores: np.ndarray, ids: list[str]) -> None:
    for start in range(0, len(ids), 20_000):
        answer = http.post("/calibrate", json={"calibrator": name, "scores": scores[start : start + 20_000].tolist(),
                                               "ids": ids[start : start + 20_000]})
        assert answer.status_code == 200, answer.text


def consume(server_url: str, stream: str, consumer: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBD_")}
    return subprocess.Popen(
        [Path(sys.executable).parent / "calibd", "consume", "--redis", REDIS_URL, "--stream", stream, "--group", "g",
         "--consumer", consumer, "--claim-idle-ms", "300", "--batch", "5000", "--url", server_url, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def group(redis_client, stream: str) -> dict:
    (info,) = [i for i in redis_client.xinfo_groups(stream) if i["name"] == b"g"]
    return info



@pytest.mark.slow
def test_labels_from_a_stream_count_once_through_two_kill_9s_and_equal_feedback(server, redis_client, stream):
    """100,000 labels by id; the consumer is killed with SIGKILL twice while the producer writes,
    and restarted under a new name (so what it left pending is reclaimed by XAUTOCLAIM). Every
    label is counted once; the monitors equal those of the same labels sent to POST /feedback;
    a malformed message lands in the dead-letter stream with its reason."""
    n = 100_000
    streamed, posted = f"streamed-{uuid.uuid4().hex[:8]}", f"posted-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(7)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < np.clip(scores * 1.1, 0, 1)).astype(int)  # a little drift
    ids = [f"r-{i}" for i in range(n)]
    t0 = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for name in (streamed, posted):
            fit_platt_over_http(http, name)
            log_predictions(http, name, scores, ids)

        bad_at = 40_000

        def produce() -> None:
            pipe = redis_client.pipeline(transaction=False)
            for i in range(n):
                if i == bad_at:
                    pipe.xadd(stream, {"format": "json", "data": b"{not json"})
                pipe.xadd(stream, {"data": orjson.dumps({"calibrator": streamed, "id": ids[i], "label": int(labels[i])})})
                if i % 2000 == 1999:
                    pipe.execute()
                    time.sleep(0.01)  # a producer at its own pace, while the consumer is killed
            pipe.execute()

        print("phase: predictions logged", time.monotonic() - t0, file=sys.stderr)
        producer = threading.Thread(target=produce)
        producer.start()
        kills = 0
        for round_ in range(2):
            process = consume(server.url, stream, f"c{round_}")
            deadline = time.monotonic() + 60
            # Kill it in mid-stream: once it has acknowledged some of what it read.
            target = (round_ + 1) * 25_000
            while time.monotonic() < deadline:
                try:
                    info = group(redis_client, stream)
                    if info["entries-read"] and info["entries-read"] - info["pending"] >= target and info["pending"]:
                        break
                except (redis.ResponseError, ValueError):
                    pass
                assert process.poll() is None, process.stderr.read().decode()[-2000:]
                time.sleep(0.05)
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
        producer.join()
        print("phase: killed twice", time.monotonic() - t0, file=sys.stderr)
        assert kills == 2
        final = consume(server.url, stream, "c-final", "--until-idle")
        try:
            final.wait(timeout=120)
        except subprocess.TimeoutExpired:
            final.kill()
            raise
        assert final.returncode == 0, final.stderr.read().decode()[-2000:]

        print("phase: consumed", time.monotonic() - t0, file=sys.stderr)
        info = group(redis_client, stream)
        assert info["pending"] == 0 and info["lag"] == 0
        dead = redis_client.xrange(f"{stream}:dead-letter")
        assert len(dead) == 1
        assert dead[0][1][b"data"] == b"{not json" and b"not JSON" in dead[0][1][b"reason"]

        # The same labels through POST /feedback, in the batches and the order the consumer committed
        # them (one request's rows share their received_at): the drift test bets once per batch, and a
        # consumer's batches depend on what the stream held when it read, and on where it was killed.
        engine = make_engine(server.settings.database_url)
        with engine.connect() as connection:
            committed = connection.execute(
                text("SELECT f.prediction_id, f.received_at FROM feedback f JOIN calibrators c ON c.id = f.calibrator_id "
                     "WHERE c.name = :name ORDER BY f.id"), {"name": streamed}).all()
        engine.dispose()
        assert sorted(i for i, _ in committed) == sorted(ids)
        batches: list[list[str]] = []
        for position, (prediction_id, received_at) in enumerate(committed):
            if position == 0 or received_at != committed[position - 1][1]:
                batches.append([])
            batches[-1].append(prediction_id)
        label_of = dict(zip(ids, labels.tolist()))
        for chunk in batches:
            answer = http.post("/feedback", json={"calibrator": posted, "ids": chunk, "labels": [label_of[i] for i in chunk]})
            assert answer.status_code == 202 and answer.json()["count"] == len(chunk), answer.text
        print("phase: posted", time.monotonic() - t0, file=sys.stderr)
        deadline = time.monotonic() + 60
        while (got := monitor(http, streamed))["windows"]["last_10000"]["samples"] != 10_000 and time.monotonic() < deadline:
            time.sleep(0.2)
        expected = monitor(http, posted)
        assert expected["windows"]["1h"]["samples"] == n
        assert got["windows"]["1h"]["samples"] == n  # each label once: none lost, none twice
        assert_same_monitors(got, expected)


def test_bad_messages_go_to_the_dead_letter_stream_and_good_ones_are_recorded(server, redis_client, stream):
    name = f"dlq-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        fit_platt_over_http(http, name)
        log_predictions(http, name, np.array([0.2, 0.4, 0.6, 0.8]), ["a", "b", "c", "d"])
        messages = [
            {"data": orjson.dumps({"calibrator": name, "id": "a", "label": 1})},
            {"data": orjson.dumps({"calibrator": name, "id": "b", "label": 7})},  # not a class: a 422 from /feedback
            {"data": orjson.dumps([1, 2])},  # not an object
            {"format": "yaml", "data": b"x: 1"},
            {"data": orjson.dumps({"calibrator": name, "ids": ["c", "d"], "labels": [0, 1]})},  # a batch message
            {"data": orjson.dumps({"calibrator": "no-such-calibrator", "ids": ["x"], "labels": [1]})},  # 404
            {"data": orjson.dumps({"calibrator": name, "id": "a", "label": 0})},  # a second label for a: a duplicate
        ]
        for fields in messages:
            redis_client.xadd(stream, fields)
        process = consume(server.url, stream, "solo", "--until-idle")
        assert process.wait(timeout=60) == 0, process.stderr.read().decode()[-2000:]
        dead = {entry[b"data"]: entry[b"reason"].decode() for _, entry in redis_client.xrange(f"{stream}:dead-letter")}
        assert set(dead) == {messages[i]["data"] for i in (1, 2, 3, 5)}
        assert dead[messages[1]["data"]].startswith("422") and dead[messages[5]["data"]].startswith("404")
        assert "not a JSON object" in dead[messages[2]["data"]] and "json or arrow" in dead[messages[3]["data"]]
        info = group(redis_client, stream)
        assert info["pending"] == 0 and info["lag"] == 0
        window = monitor(http, name)["windows"]["1h"]
        assert window["samples"] == 3  # a, c and d; b refused; a's second label a duplicate
