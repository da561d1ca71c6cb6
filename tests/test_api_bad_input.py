"""Bad input gets a 4xx problem response naming the field, and writes nothing."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from calibd.config import Settings

from .conftest import LiveServer

GOOD_SCORES = np.linspace(0.05, 0.95, 20).tolist()
GOOD_LABELS = [0, 1] * 10


def fit_body(**changes) -> dict:
    holdout = {"scores": list(GOOD_SCORES), "labels": list(GOOD_LABELS)}
    holdout.update(changes.pop("holdout", {}))
    return {"name": "bad-input", "method": "platt", "holdout": holdout} | changes


def with_score(index: int, value) -> list:
    scores = list(GOOD_SCORES)
    scores[index] = value
    return scores


# (case, request body, expected status, expected pointer)
FIT_CASES = [
    ("nan score", fit_body(holdout={"scores": with_score(3, float("nan"))}), 422, "/holdout/scores/3"),
    ("inf score", fit_body(holdout={"scores": with_score(4, float("inf"))}), 422, "/holdout/scores/4"),
    ("probability above 1", fit_body(holdout={"scores": with_score(5, 1.5)}), 422, "/holdout/scores/5"),
    ("probability below 0", fit_body(holdout={"scores": with_score(6, -0.1)}), 422, "/holdout/scores/6"),
    ("string score", fit_body(holdout={"scores": with_score(1, "0.3")}), 422, "/holdout/scores"),
    ("null score", fit_body(holdout={"scores": with_score(1, None)}), 422, "/holdout/scores"),
    ("nested scores", fit_body(holdout={"scores": [[0.1, 0.2]] * 20}), 422, "/holdout/scores"),
    ("label 2", fit_body(holdout={"labels": [0, 1] * 9 + [2, 1]}), 422, "/holdout/labels/18"),
    ("label 0.5", fit_body(holdout={"labels": [0.5] + [0, 1] * 9 + [1]}), 422, "/holdout/labels/0"),
    ("length mismatch", fit_body(holdout={"labels": [0, 1] * 9}), 422, "/holdout/labels"),
    ("empty holdout", fit_body(holdout={"scores": [], "labels": []}), 422, "/holdout/scores"),
    ("below the minimum", fit_body(holdout={"scores": GOOD_SCORES[:6], "labels": GOOD_LABELS[:6]}), 422, "/holdout/scores"),
    ("one class only", fit_body(holdout={"labels": [1] * 20}), 422, "/holdout/labels"),
    ("one sample of a class", fit_body(holdout={"labels": [1] + [0] * 19}), 422, "/holdout/labels"),
    ("negative weight", fit_body(holdout={"sample_weight": [1.0] * 7 + [-1.0] + [1.0] * 12}), 422, "/holdout/sample_weight/7"),
    ("weights mismatch", fit_body(holdout={"sample_weight": [1.0] * 3}), 422, "/holdout/sample_weight"),
    ("unknown method", fit_body(method="magic"), 422, "/method"),
    ("unknown option", fit_body(options={"n_bins": 3}), 422, "/options/n_bins"),
    ("bad option value", fit_body(options={"smooth_targets": "yes"}), 422, "/options/smooth_targets"),
    ("unknown input kind", fit_body(input="odds"), 422, "/input"),
    ("invalid name", fit_body(name="Bad Name!"), 422, "/name"),
    ("name too long", fit_body(name="a" * 64), 422, "/name"),
    ("unknown field", fit_body(colour="blue"), 422, "/colour"),
    ("missing holdout", {"name": "x", "method": "platt"}, 422, "/holdout"),
]


@pytest.mark.parametrize("case,body,status,at", FIT_CASES, ids=[c[0] for c in FIT_CASES])
def test_bad_fit_is_rejected_and_writes_nothing(client, row_counts, case, body, status, at):
    before = row_counts()
    # json.dumps writes NaN and Infinity literals, as Python clients do.
    response = client.post("/calibrators", content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    assert at in [e["pointer"] for e in problem["errors"]], problem
    assert row_counts() == before


def test_malformed_and_mistyped_bodies(client, row_counts):
    before = row_counts()
    response = client.post("/calibrators", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["status"] == 400
    response = client.post("/calibrators", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert response.status_code == 400
    response = client.post("/calibrators", content=b"name=x", headers={"content-type": "text/plain"})
    assert response.status_code == 415
    assert row_counts() == before


@pytest.mark.parametrize(
    "csv,fragment",
    [
        ("label,score\n0,0.1\n1,abc\n", "line 3, column score"),
        ("label,score\n0,0.1\n1,0.2,7\n", "line 3 has 3 fields"),
        ("label,score\n" + "".join(f"{i % 2},{1.5 if i == 4 else 0.5}\n" for i in range(20)), "line 6, column score"),
        ("label,score\n" + "".join(f"{3 if i == 2 else i % 2},0.5\n" for i in range(20)), "line 4, column label"),
        ("label,probability\n0,0.1\n", "unknown column 'probability'"),
        ("score\n0.1\n", "no 'label' column"),
        ("label,score\n", "no rows"),
    ],
)
def test_bad_csv_upload_names_the_line_and_column(client, row_counts, csv, fragment):
    before = row_counts()
    response = client.post(
        "/calibrators", data={"name": "bad-csv", "method": "platt"}, files={"file": ("h.csv", csv, "text/csv")}
    )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["pointer"] == "/file"
    assert fragment in problem["errors"][0]["detail"]
    assert row_counts() == before


def test_csv_upload_without_a_file(client):
    response = client.post("/calibrators", data={"name": "x", "method": "platt"}, files={"other": ("a", b"b")})
    assert response.status_code == 422


@pytest.fixture
def served(client, name):
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=100)
    labels = (rng.uniform(size=100) < scores).astype(int)
    body = {"name": name, "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    assert client.post("/calibrators", json=body).status_code == 201
    return name


CALIBRATE_CASES = [
    ("nan", {"scores": [0.1, float("nan")]}, 422, "/scores/1"),
    ("inf", {"scores": [float("-inf")]}, 422, "/scores/0"),
    ("out of range", {"scores": [0.1, 0.2, 1.01]}, 422, "/scores/2"),
    ("empty", {"scores": []}, 422, "/scores"),
    ("rows for a binary calibrator", {"scores": [[0.1, 0.9]]}, 422, "/scores"),
    ("not numbers", {"scores": ["a"]}, 422, "/scores"),
    ("missing scores", {}, 422, "/scores"),
    ("bad version", {"scores": [0.1], "version": 0}, 422, "/version"),
    ("unknown field", {"scores": [0.1], "extra": 1}, 422, "/extra"),
]


@pytest.mark.parametrize("case,body,status,at", CALIBRATE_CASES, ids=[c[0] for c in CALIBRATE_CASES])
def test_bad_calibrate_request(client, served, case, body, status, at):
    response = client.post(
        "/calibrate", content=json.dumps({"calibrator": served} | body), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert at in [e["pointer"] for e in response.json()["errors"]]


def test_unknown_calibrator_or_version_is_404(client, served):
    assert client.post("/calibrate", json={"calibrator": "no-such-thing", "scores": [0.5]}).status_code == 404
    response = client.post("/calibrate", json={"calibrator": served, "version": 7, "scores": [0.5]})
    assert response.status_code == 404 and "version 7" in response.json()["detail"]
    assert client.get("/calibrators/no-such-thing").status_code == 404
    assert client.get(f"/calibrators/{served}/versions/7").status_code == 404
    assert client.post("/calibrators/no-such-thing/promote", json={"version": 1}).status_code == 404
    assert client.delete("/calibrators/no-such-thing").status_code == 404


def test_invalid_path_and_query_parameters(client):
    response = client.get("/calibrators/Not%20Valid")
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/path/name"
    assert client.get("/calibrators", params={"limit": 0}).status_code == 422
    response = client.get("/calibrators", params={"cursor": "%%%"})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/query/cursor"
    assert client.get("/calibrators/x/versions/0").status_code == 422


def test_unknown_route_is_a_problem(client):
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_body_over_the_limit_is_refused_before_it_is_read(database_url, row_counts):
    limit = 10_000
    body = json.dumps(fit_body(holdout={"scores": [0.5] * 2000, "labels": [0, 1] * 1000})).encode()
    assert len(body) > limit
    before = row_counts()
    with LiveServer(Settings(database_url=database_url, max_body_bytes=limit)) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            declared = http.post("/calibrators", content=body, headers={"content-type": "application/json"})
            assert declared.status_code == 413
            assert "10000 bytes" in declared.json()["detail"]

            def chunks():  # no Content-Length: counted as it streams
                for start in range(0, len(body), 1000):
                    yield body[start : start + 1000]

            streamed = http.post("/calibrators", content=chunks(), headers={"content-type": "application/json"})
            assert streamed.status_code == 413
            small = http.post("/calibrate", json={"calibrator": "x", "scores": [0.5]})
            assert small.status_code == 404  # under the limit, served as usual
    assert row_counts() == before
