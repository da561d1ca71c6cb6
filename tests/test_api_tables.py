"""Holdouts and feedback as Parquet files and Arrow IPC streams: the same fits as JSON, and
errors that name the column."""

from __future__ import annotations

import io
import os
import socket
import threading
import time

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibd.api.tables import ARROW_STREAM
from calibd.config import Settings
from tests.conftest import LiveServer
from tests.test_api_calibrators import holdout


def parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def arrow_stream(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def fit_json(client, body: dict) -> dict:
    response = client.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    return stored(client, response.json())


def stored(client, created: dict) -> dict:
    """The full stored version (summary and parameters) of a fit's answer."""
    response = client.get(f"/calibrators/{created['name']}/versions/{created['version']}")
    assert response.status_code == 200, response.text
    return response.json()


def fit_parquet(client, fields: dict, table: pa.Table) -> httpx.Response:
    return client.post(
        "/calibrators", data=fields, files={"file": ("holdout.parquet", parquet(table), "application/vnd.apache.parquet")}
    )


def fit_arrow(client, params: dict, table: pa.Table) -> httpx.Response:
    return client.post("/calibrators", params=params, content=arrow_stream(table), headers={"Content-Type": ARROW_STREAM})


def same_fit(a: dict, b: dict) -> None:
    assert a["holdout_sha256"] == b["holdout_sha256"]
    assert a["parameters"] == b["parameters"]
    # Measured durations (``timings``) differ from one fit to the next; everything else is the same.
    assert {k: v for k, v in a["summary"].items() if k != "timings"} == {k: v for k, v in b["summary"].items() if k != "timings"}


def test_a_parquet_upload_fits_the_same_calibrator_as_json(client, name):
    data = holdout(seed=5)
    weights = np.linspace(0.5, 2.0, 400)
    table = pa.table({"label": pa.array(data["labels"], pa.int8()), "score": data["scores"], "weight": weights})
    response = fit_parquet(client, {"name": name, "method": "platt"}, table)
    assert response.status_code == 201, response.text
    from_parquet = stored(client, response.json())
    from_json = fit_json(client, {"name": name, "method": "platt", "holdout": data | {"sample_weight": weights.tolist()}})
    same_fit(from_parquet, from_json)


def test_an_arrow_stream_fits_the_same_multiclass_calibrator_as_json(client, name):
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (600, 3))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    names = np.array(["cat", "dog", "eel"])
    labels = names[[rng.choice(3, p=p) for p in probabilities]]
    columns = {f"score_{k}": probabilities[:, k] for k in range(3)}
    table = pa.table({"label": pa.array(labels.tolist()).dictionary_encode(), **columns})
    params = {"name": name, "method": "temperature", "options": "{}", "promote": "false"}
    response = fit_arrow(client, params, table)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["current"] is False and created["classes"] == ["cat", "dog", "eel"]
    from_arrow = stored(client, created)
    body = {"name": name, "method": "temperature", "options": {}, "promote": False,
            "holdout": {"scores": probabilities.tolist(), "labels": labels.tolist()}}
    same_fit(from_arrow, fit_json(client, body))


def test_a_method_takes_its_extra_rows_as_a_list_column_or_numbered_columns(client, name):
    rng = np.random.default_rng(8)
    scores = rng.uniform(0.02, 0.98, 400)
    labels = (rng.uniform(size=400) < scores).astype(np.int64)
    features = rng.normal(size=(400, 2))
    options = '{"hidden": [4], "epochs": 2}'
    listed = pa.table({"label": labels, "score": scores, "features": pa.array(features.tolist(), pa.list_(pa.float64(), 2))})
    numbered = pa.table({"label": labels, "score": scores, "features_0": features[:, 0], "features_1": features[:, 1]})
    fits = []
    for table in (listed, numbered):
        response = fit_parquet(client, {"name": name, "method": "selective", "options": options}, table)
        assert response.status_code == 201, response.text
        fits.append(stored(client, response.json()))
    body = {"name": name, "method": "selective", "options": {"hidden": [4], "epochs": 2},
            "holdout": {"scores": scores.tolist(), "labels": labels.tolist(), "features": features.tolist()}}
    from_json = fit_json(client, body)
    for fitted in fits:
        assert fitted["holdout_sha256"] == from_json["holdout_sha256"]
        assert fitted["parameters"] == from_json["parameters"]


GOOD = {"label": pa.array([0, 1, 0, 1, 1, 0, 1, 0, 1, 1] * 3, pa.int64()), "score": np.linspace(0.05, 0.95, 30)}


def with_column(name: str, values: pa.Array | None) -> pa.Table:
    columns = dict(GOOD)
    if values is None:
        columns.pop(name)
    else:
        columns[name] = values
    return pa.table(columns)


NAN_AT_7 = np.linspace(0.05, 0.95, 30)
NAN_AT_7[7] = np.nan


@pytest.mark.parametrize(
    "table, column, words",
    [
        (with_column("label", None), "label", "missing"),
        (with_column("score", None), "score", "missing"),
        (with_column("score", pa.array([str(v) for v in GOOD["score"]])), "score", "numbers"),
        (with_column("label", pa.array([True, False] * 15)), "label", "bool"),
        (with_column("score", pa.array([True, False] * 15)), "score", "bool"),
        (with_column("score", pa.array(NAN_AT_7)), "score/7", "finite"),
        (with_column("score", pa.array([0.5] * 4 + [None] + [0.5] * 25, pa.float64())), "score/4", "null"),
        (with_column("label", pa.array([0, 1] * 10 + [2] + [0] * 9)), "label/20", "0 or 1"),
        (with_column("weight", pa.array([1.0] * 29 + [-1.0])), "weight/29", "non-negative"),
        (pa.table({**GOOD, "colour": pa.array(["red"] * 30)}), "colour", "numbers"),
        (pa.table({**GOOD, "extra": np.zeros(30)}), "extra", "takes no array"),
    ],
)
def test_a_bad_table_is_a_422_naming_the_column_and_writes_nothing(client, name, row_counts, table, column, words):
    before = row_counts()
    for response, prefix in (
        (fit_parquet(client, {"name": name, "method": "isotonic"}, table), "/file/"),
        (fit_arrow(client, {"name": name, "method": "isotonic"}, table), "/"),
    ):
        assert response.status_code == 422, response.text
        error = response.json()["errors"][0]
        assert error["pointer"] == prefix + column, error
        assert words in error["detail"], error
        assert column.split("/")[0] in error["detail"]
    assert row_counts() == before


def test_bytes_that_are_not_a_table_are_a_422(client, name):
    response = client.post("/calibrators", params={"name": name, "method": "isotonic"}, content=b"not arrow",
                           headers={"Content-Type": ARROW_STREAM})
    assert response.status_code == 422 and "Arrow IPC stream" in response.json()["detail"]
    response = client.post("/calibrators", data={"name": name, "method": "isotonic"},
                           files={"file": ("h.parquet", b"PAR1 and then nothing", "application/vnd.apache.parquet")})
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/file"


def test_an_arrow_fit_without_its_name_points_at_the_field(client):
    response = fit_arrow(client, {"method": "isotonic"}, pa.table(GOOD))
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/name"


def test_a_large_parquet_upload_is_spooled_for_the_worker_and_the_spool_removed(database_url, name, tmp_path):
    from calibd.workers.spool import SPOOL_MIN_BYTES

    rng = np.random.default_rng(11)
    scores = rng.uniform(size=200_000)
    labels = (rng.uniform(size=200_000) < scores).astype(np.int8)
    content = parquet(pa.table({"label": labels, "score": scores}))
    assert len(content) > SPOOL_MIN_BYTES
    # A spool folder of this server's own (CALIBD_SPOOL_DIR), watched while the fit runs:
    # the upload must land there, and be gone once the fit has answered.
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(os.listdir(tmp_path))
            time.sleep(0.005)

    with LiveServer(Settings(database_url=database_url, spool_dir=str(tmp_path))) as live, \
            httpx.Client(base_url=live.url, timeout=60) as client:
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            response = client.post("/calibrators", data={"name": name, "method": "isotonic"},
                                   files={"file": ("h.parquet", content, "application/octet-stream")})
        finally:
            done.set()
            watcher.join()
        assert response.status_code == 201, response.text
        assert response.json()["n_samples"] == 200_000
        assert any(entry.startswith("calibd-fit-") for entry in seen), seen
        assert os.listdir(tmp_path) == []
        from_json = fit_json(client, {"name": name, "method": "isotonic",
                                      "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}})
        assert stored(client, response.json())["holdout_sha256"] == from_json["holdout_sha256"]


def test_a_table_over_the_body_limit_is_refused_before_it_is_read(database_url):
    with LiveServer(Settings(database_url=database_url, max_body_bytes=10_000)) as live:
        for content_type in (ARROW_STREAM, "multipart/form-data; boundary=x"):
            with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
                # Only the headers are sent: the answer comes without the body being read.
                sock.sendall(
                    f"POST /calibrators?name=x&method=isotonic HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                    "Content-Length: 1000000000\r\n\r\n".encode()
                )
                head = sock.recv(65536).decode()
            assert head.startswith("HTTP/1.1 413"), head


# -- feedback ------------------------------------------------------------------------------------
def test_feedback_as_parquet_or_arrow_counts_as_the_same_json(client, name):
    fit_json(client, {"name": name, "method": "platt", "holdout": holdout(seed=2)})
    rng = np.random.default_rng(4)
    probabilities = rng.uniform(0.05, 0.95, 50)
    labels = (rng.uniform(size=50) < probabilities).astype(np.int64)
    table = pa.table({"probability": probabilities, "label": labels, "score": probabilities})
    as_json = client.post("/feedback", json={"calibrator": name, "probabilities": probabilities.tolist(),
                                             "labels": labels.tolist(), "scores": probabilities.tolist()})
    as_parquet = client.post("/feedback", data={"calibrator": name, "version": "1"},
                             files={"file": ("fb.parquet", parquet(table), "application/vnd.apache.parquet")})
    as_arrow = client.post("/feedback", params={"calibrator": name}, content=arrow_stream(table),
                           headers={"Content-Type": ARROW_STREAM})
    for response in (as_json, as_parquet, as_arrow):
        assert response.status_code == 202, response.text
        assert response.json()["count"] == 50
    monitor = client.get(f"/calibrators/{name}/monitor").json()
    assert monitor["drift"]["samples"] == 150


def test_feedback_by_id_as_arrow_labels_logged_predictions(client, name):
    fit_json(client, {"name": name, "method": "platt", "holdout": holdout(seed=2)})
    ids = [f"p{i}" for i in range(5)]
    served = client.post("/calibrate", json={"calibrator": name, "scores": [0.1, 0.3, 0.5, 0.7, 0.9], "ids": ids})
    assert served.status_code == 200, served.text
    table = pa.table({"id": ids + ["nope"], "label": [0, 0, 1, 1, 1, 0]})
    response = client.post("/feedback", params={"calibrator": name}, content=arrow_stream(table),
                           headers={"Content-Type": ARROW_STREAM})
    assert response.status_code == 202, response.text
    # Labels for predictions the log has not written yet wait for them; "nope" waits in vain.
    receipt = response.json()
    assert receipt["count"] + receipt["pending"] == 6 and "nope" in receipt["unknown_ids"], receipt
    deadline = time.monotonic() + 10
    while client.get(f"/calibrators/{name}/monitor").json()["windows"]["last_10000"]["samples"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize(
    "columns, pointer",
    [
        ({"probability": [0.2, 0.8]}, "/label"),
        ({"probability": [0.2, float("nan")], "label": [0, 1]}, "/probability/1"),
        ({"probability": [0.2, 0.8], "label": [True, False]}, "/label"),
        ({"probability": [0.2, 0.8], "label": [0, 1], "accepted": [1, 0]}, "/accepted"),
        ({"probability": [0.2, 0.8], "label": [0, 1], "mood": [1, 0]}, "/mood"),
    ],
)
def test_bad_feedback_tables_name_the_column_and_write_nothing(client, name, row_counts, columns, pointer):
    fit_json(client, {"name": name, "method": "platt", "holdout": holdout(seed=2)})
    before = row_counts()
    table = pa.table(columns)
    response = client.post("/feedback", params={"calibrator": name}, content=arrow_stream(table),
                           headers={"Content-Type": ARROW_STREAM})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == pointer
    response = client.post("/feedback", data={"calibrator": name},
                           files={"file": ("fb.parquet", parquet(table), "application/vnd.apache.parquet")})
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/file" + pointer
    assert row_counts() == before


def test_a_feedback_upload_with_an_idempotency_key_is_replayed_and_a_reused_key_refused(client, name):
    fit_json(client, {"name": name, "method": "platt", "holdout": holdout(seed=2)})
    table = pa.table({"probability": [0.2, 0.7, 0.9], "label": [0, 1, 1]})
    headers = {"Idempotency-Key": f"upload-{name}"}

    def send(content: bytes) -> httpx.Response:
        return client.post("/feedback", data={"calibrator": name}, headers=headers,
                           files={"file": ("f.parquet", content, "application/vnd.apache.parquet")})

    first = send(parquet(table))
    assert first.status_code == 202 and first.json()["count"] == 3, first.text
    replay = send(parquet(table))
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    other = send(parquet(table.slice(0, 2)))
    assert other.status_code == 422 and other.json()["errors"][0]["pointer"] == "/header/Idempotency-Key"
    assert client.get(f"/calibrators/{name}/monitor").json()["windows"]["1h"]["samples"] == 3


def test_a_large_arrow_stream_fits_from_its_spool(client, name):
    from calibd.workers.spool import SPOOL_MIN_BYTES

    rng = np.random.default_rng(12)
    scores = rng.uniform(size=150_000)
    labels = (rng.uniform(size=150_000) < scores).astype(np.int8)
    content = arrow_stream(pa.table({"label": labels, "score": scores}))
    assert len(content) > SPOOL_MIN_BYTES
    response = client.post("/calibrators", params={"name": name, "method": "isotonic"}, content=content,
                           headers={"Content-Type": ARROW_STREAM})
    assert response.status_code == 201, response.text
    assert response.json()["n_samples"] == 150_000


def test_openapi_documents_the_table_bodies(client):
    spec = client.get("/openapi.json").json()
    for path in ("/calibrators", "/feedback"):
        content = spec["paths"][path]["post"]["requestBody"]["content"]
        assert {"application/json", "multipart/form-data", ARROW_STREAM} <= set(content), path
