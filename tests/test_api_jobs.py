"""Asynchronous fits: 202 with a job to follow, progress, result or problem, and interrupted jobs."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np

from calibd.storage import jobs as job_store
from calibd.storage.db import make_engine, make_sessionmaker
from calibd.storage.models import utcnow


def holdout(n, seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.01, 0.99, n)
    return {"scores": scores.tolist(), "labels": (rng.uniform(size=n) < scores**2).astype(int).tolist()}


def follow(client, location, deadline=120):
    seen = []
    end = time.monotonic() + deadline
    while True:
        job = client.get(location).json()
        seen.append(job)
        if job["state"] in ("succeeded", "failed"):
            return job, seen
        assert time.monotonic() < end, seen[-1]
        time.sleep(0.2)


def test_an_async_fit_answers_202_and_its_job_ends_with_the_stored_version(client, name):
    response = client.post("/calibrators", params={"async": "true"},
                           json={"name": name, "method": "isotonic", "holdout": holdout(200_000)})
    assert response.status_code == 202
    location = response.headers["Location"]
    assert location == f"/jobs/{response.json()['id']}"
    assert response.json()["state"] == "queued"
    job, seen = follow(client, location)
    assert job["state"] == "succeeded" and job["progress"] == 1.0 and job["problem"] is None
    assert job["calibrator"] == name and job["result"]["version"] == 1
    assert job["started_at"] <= job["finished_at"]
    progress = [j["progress"] for j in seen]
    assert progress == sorted(progress)  # never goes backwards
    stored = client.get(f"/calibrators/{name}/versions/1").json()
    assert stored["holdout_sha256"] == job["result"]["holdout_sha256"]
    assert client.post("/calibrate", json={"calibrator": name, "scores": [0.5]}).json()["version"] == 1


def test_an_async_fit_of_bad_input_fails_with_problem_details(client, name, row_counts):
    before = row_counts()
    bad = holdout(50)
    bad["scores"][3] = 1.5
    response = client.post("/calibrators?async=true", json={"name": name, "method": "platt", "holdout": bad})
    assert response.status_code == 202
    job, _ = follow(client, response.headers["Location"])
    assert job["state"] == "failed" and job["result"] is None
    assert job["problem"]["status"] == 422
    assert job["problem"]["errors"][0]["pointer"] == "/holdout/scores/3"
    after = row_counts()
    assert {k: v for k, v in after.items() if k != "fit_jobs"} == {k: v for k, v in before.items() if k != "fit_jobs"}


def test_without_async_the_fit_still_answers_201(client, name):
    assert client.post("/calibrators", json={"name": name, "method": "platt", "holdout": holdout(100)}).status_code == 201


def test_unknown_job_is_404(client):
    assert client.get("/jobs/0123456789abcdef").status_code == 404


def test_a_job_whose_process_stopped_is_marked_failed(database_url):
    sessions = make_sessionmaker(make_engine(database_url))
    orphan = job_store.create_job(sessions, "orphan" + utcnow().strftime("%H%M%S%f"), "gone", owner="dead-process")
    job_store.update_job(sessions, orphan.id, state="running")
    # Its process stopped refreshing the heartbeat more than the timeout ago.
    later = utcnow() + job_store.HEARTBEAT_TIMEOUT + timedelta(seconds=1)
    assert job_store.sweep_interrupted(sessions, now=later) >= 1
    swept = job_store.get_job(sessions, orphan.id)
    assert swept.state == "failed" and "interrupted" in swept.problem["detail"]
    assert job_store.sweep_interrupted(sessions, now=later) == 0 or job_store.get_job(sessions, orphan.id).state == "failed"
