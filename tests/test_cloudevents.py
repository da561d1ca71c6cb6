"""POST /cloudevents: KServe's payload logger as the prediction log, over HTTP, on SQLite and PostgreSQL.

The events are built with the CloudEvents SDK and shaped as KServe's logger sends them
(kserve/kserve, pkg/logger/worker.go ``sendHttpCloudEvent``, commit aaac4e29): binary mode;
ce-id shared by the request and its response (handler.go ``getOrCreateID``); ce-type
``org.kubeflow.serving.inference.request`` / ``.response``; ce-source the agent's
``http://localhost:<port>/`` (cmd/agent/main.go); ce-time; the extensions inferenceservicename,
namespace, component, endpoint, metadata (JSON of the logged headers) and recordedtime; and the
body the payload, with the *request's* Content-Type on both halves.
"""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import httpx
import numpy as np
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from calibd.config import Settings

from .conftest import LiveServer, fit_platt_over_http, stored_platt_version
from .monitors import assert_same_monitors, monitor

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"


def kserve_event(ce_id: str, kind: str, service: str, payload: dict) -> tuple[dict[str, str], bytes]:
    """Headers and body of one event as KServe's logger posts it."""
    now = datetime.now(timezone.utc)
    event = CloudEvent(
        {
            "id": ce_id,
            "type": REQUEST_TYPE if kind == "request" else RESPONSE_TYPE,
            "source": "http://localhost:9081/",
            "specversion": "1.0",
            "time": now,
            "datacontenttype": "application/json",
            "inferenceservicename": service,
            "namespace": "default",
            "component": "predictor",
            "endpoint": "",
            "metadata": "{}",
            "recordedtime": now.isoformat(),
        },
        data=json.dumps(payload).encode(),
    )
    message = to_binary_event(event)
    return dict(message.headers), message.body


def v2_request(p: float) -> dict:
    return {"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32", "data": [[6.8, 2.8, 4.8, 1.4]]}]}


def v2_response(ce_id: str, p: float, service: str) -> dict:
    """An MLServer scikit-learn answer: predict_proba, one row of [P(0), P(1)]."""
    return {"model_name": service, "id": ce_id, "parameters": {},
            "outputs": [{"name": "predict_proba", "shape": [1, 2], "datatype": "FP64", "data": [1 - p, p]}]}


def post(http: httpx.Client, ce_id: str, kind: str, service: str, p: float) -> dict:
    payload = v2_request(p) if kind == "request" else v2_response(ce_id, p, service)
    headers, body = kserve_event(ce_id, kind, service, payload)
    answer = http.post("/cloudevents", headers=headers, content=body)
    assert answer.status_code == 202, answer.text
    return answer.json()


def metric(http: httpx.Client, sample: str) -> float:
    text = http.get("/metrics").text
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_ten_thousand_pairs_out_of_order_and_twice_give_the_monitors_of_calibrate_with_ids(server):
    """10,000 request/response pairs: a tenth with the response first, a twentieth with a half
    sent twice (before and after pairing). Labelled by ce-id through /feedback, they give the same
    monitors as the same scores sent to /calibrate with ids and labelled the same way."""
    n = 10_000
    logged, direct = f"ce-{uuid.uuid4().hex[:8]}", f"ids-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(11)
    scores = rng.uniform(0.01, 0.99, n)
    labels = (rng.uniform(size=n) < np.clip(scores * 1.1, 0, 1)).astype(int)  # a little drift
    ids = [str(uuid.uuid4()) for _ in range(n)]  # KServe's own ids when the caller sends none
    order = random.Random(5)
    plans = []
    for i in range(n):
        halves = ["response", "request"] if order.random() < 0.1 else ["request", "response"]
        if order.random() < 0.05:
            halves.insert(order.randrange(len(halves) + 1), order.choice(halves))  # one half sent again
        plans.append(halves)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        fit_platt_over_http(http, logged)
        fit_platt_over_http(http, direct)

        def send(chunk: range) -> list[str]:
            with httpx.Client(base_url=server.url, timeout=120) as own:
                return [post(own, ids[i], kind, logged, float(scores[i]))["outcome"] for i in chunk for kind in plans[i]]

        with ThreadPoolExecutor(4) as pool:  # each pair's halves in its plan's order, pairs side by side
            outcomes = [o for part in pool.map(send, [range(k, n, 4) for k in range(4)]) for o in part]
        assert outcomes.count("paired") == n
        assert outcomes.count("duplicate") == sum(len(p) - 2 for p in plans) > 0
        for start in range(0, n, 5000):
            answer = http.post("/calibrate", json={"calibrator": direct, "scores": scores[start : start + 5000].tolist(),
                                                   "ids": ids[start : start + 5000]})
            assert answer.status_code == 200, answer.text
        time.sleep(1.0)  # both prediction logs are written every 0.2 s
        for name in (logged, direct):
            for start in range(0, n, 5000):
                answer = http.post("/feedback", json={"calibrator": name, "ids": ids[start : start + 5000],
                                                      "labels": labels[start : start + 5000].tolist()})
                body = answer.json()
                # Every label found its prediction: each pair was logged once, under its ce-id.
                assert answer.status_code == 202 and body["count"] == 5000 and body["pending"] == 0, answer.text
        got, expected = monitor(http, logged), monitor(http, direct)
        assert expected["windows"]["1h"]["samples"] == n and got["windows"]["1h"]["samples"] == n
        assert_same_monitors(got, expected)


def test_a_batch_response_logs_one_prediction_per_row_and_a_v1_response_is_taken(client, name):
    fit_platt_over_http(client, name)
    headers, body = kserve_event("batch-1", "response", name, {
        "outputs": [{"name": "label", "shape": [3], "datatype": "INT64", "data": [0, 1, 1]},
                    {"name": "predict_proba", "shape": [3, 2], "datatype": "FP64", "data": [0.9, 0.1, 0.4, 0.6, 0.2, 0.8]}]})
    assert client.post("/cloudevents", headers=headers, content=body).json()["outcome"] == "waiting"
    assert post(client, "batch-1", "request", name, 0.5)["outcome"] == "paired"
    headers, body = kserve_event("v1-1", "response", name, {"predictions": [[0.3, 0.7]]})
    assert client.post("/cloudevents", headers=headers, content=body).json()["outcome"] == "waiting"
    assert post(client, "v1-1", "request", name, 0.5)["outcome"] == "paired"
    expected = client.post("/calibrate", json={"calibrator": name, "scores": [0.1, 0.6, 0.8, 0.7]}).json()["probabilities"]
    time.sleep(0.6)
    answer = client.post("/feedback", json={"calibrator": name, "ids": ["batch-1/0", "batch-1/1", "batch-1/2", "v1-1"],
                                            "labels": [0, 1, 1, 1]})
    assert answer.status_code == 202 and answer.json()["count"] == 4, answer.text
    window = client.get(f"/calibrators/{name}/monitor").json()["windows"]["1h"]
    assert window["samples"] == 4 and window["mean_prediction"] == pytest.approx(np.mean(expected), rel=1e-12)


@pytest.mark.parametrize(
    ("change", "status", "pointer"),
    [
        ({"ce-id": None}, 422, "/headers/ce-id"),
        ({"ce-type": "org.kubeflow.serving.inference.other"}, 422, "/headers/ce-type"),
        ({"ce-specversion": "0.3"}, 422, "/headers/ce-specversion"),
        ({"ce-source": None}, 422, "/headers/ce-source"),
        ({"ce-inferenceservicename": None}, 422, "/headers/ce-inferenceservicename"),
        ({"content-type": "application/cloudevents+json"}, 415, None),
    ],
)
def test_a_malformed_event_is_refused_naming_the_header_and_writes_nothing(client, name, row_counts, change, status, pointer):
    fit_platt_over_http(client, name)
    ce_id = str(uuid.uuid4())
    headers, body = kserve_event(ce_id, "response", name, v2_response(ce_id, 0.4, name))
    for key, value in change.items():
        headers.pop(key)
        if value is not None:
            headers[key] = value
    before = row_counts()
    answer = client.post("/cloudevents", headers=headers, content=body)
    assert answer.status_code == status, answer.text
    if pointer:
        assert pointer in answer.text
    # Nothing kept either: the same id's request half, well formed, waits rather than pairs.
    assert post(client, ce_id, "request", name, 0.4)["outcome"] == "waiting"
    time.sleep(0.5)
    assert row_counts() == before


@pytest.mark.parametrize(
    ("payload", "pointer"),
    [
        ({"outputs": [{"name": "predict", "shape": [1], "datatype": "INT64", "data": [1]}]}, "/outputs"),
        ({"outputs": [{"name": "predict_proba", "shape": [1, 3], "datatype": "FP64", "data": [0.1, 0.2]}]}, "/outputs/0/shape"),
        ({"outputs": [{"name": "predict_proba", "shape": [1, 2], "datatype": "FP64", "data": [0.5, None]}]}, "/outputs/0/data"),
        ({"outputs": [{"name": "predict_proba", "shape": [1, 3], "datatype": "FP64", "data": [0.1, 0.2, 0.7]}]}, "/outputs"),
        ({"outputs": [{"name": "predict_proba", "shape": [1, 2], "datatype": "FP64", "data": [0.5, 0.5],
                       "parameters": [1]}]}, "/outputs/0/parameters"),
        ({"predictions": "yes"}, "/predictions"),
        ({"something": 1}, "/outputs"),
    ],
)
def test_a_response_without_usable_scores_is_a_422_naming_the_field(client, name, payload, pointer):
    fit_platt_over_http(client, name)
    headers, body = kserve_event(f"out-{uuid.uuid4().hex}", "response", name, payload)
    answer = client.post("/cloudevents", headers=headers, content=body)
    assert answer.status_code == 422, answer.text
    assert any(error["pointer"] == pointer for error in answer.json()["errors"]), answer.text


def test_a_response_whose_row_ids_would_not_fit_is_a_422_naming_ce_id(client, name, row_counts):
    """A response of several rows is logged as ce-id/0, ce-id/1, ...: a ce-id that fits alone but not
    with its row suffix is refused at once (stored, it would fail the prediction log's whole write)."""
    fit_platt_over_http(client, name)
    rows = {"outputs": [{"name": "predict_proba", "shape": [2, 2], "datatype": "FP64", "data": [0.6, 0.4, 0.3, 0.7]}]}
    before = row_counts()
    headers, body = kserve_event("x" * 127, "response", name, rows)
    answer = client.post("/cloudevents", headers=headers, content=body)
    assert answer.status_code == 422, answer.text
    assert any(error["pointer"] == "/headers/ce-id" for error in answer.json()["errors"]), answer.text
    headers, body = kserve_event("x" * 126, "response", name, {"predictions": [0.4]})  # one row: no suffix
    assert client.post("/cloudevents", headers=headers, content=body).status_code == 202
    time.sleep(0.5)
    assert row_counts() == before


@pytest.mark.parametrize("kind", ["request", "response"])
def test_an_unknown_calibrator_is_a_404(client, kind):
    service = f"nobody-{uuid.uuid4().hex}"
    payload = v2_request(0.3) if kind == "request" else v2_response("nobody-1", 0.3, service)
    headers, body = kserve_event("nobody-1", kind, service, payload)
    assert client.post("/cloudevents", headers=headers, content=body).status_code == 404


def test_the_query_names_the_calibrator_and_the_output(client, name):
    fit_platt_over_http(client, name)
    headers, body = kserve_event("q-1", "response", "sklearn-iris", {
        "outputs": [{"name": "probability", "shape": [1], "datatype": "FP32", "data": [0.25]}]})
    answer = client.post(f"/cloudevents?calibrator={name}&output=probability", headers=headers, content=body)
    assert answer.status_code == 202 and answer.json()["outcome"] == "waiting", answer.text
    headers, body = kserve_event("q-1", "request", "sklearn-iris", v2_request(0.25))
    assert client.post(f"/cloudevents?calibrator={name}", headers=headers, content=body).json()["outcome"] == "paired"


def test_unpaired_halves_are_bounded_and_their_drops_counted(database_url, name):
    with LiveServer(Settings(database_url=database_url, cloudevents_max_unpaired=100)) as live:
        with httpx.Client(base_url=live.url, timeout=60) as http:
            fit_platt_over_http(http, name)
            before = metric(http, 'calibd_cloudevents_unpaired_dropped_total{half="request",reason="full"}')
            for i in range(150):
                assert post(http, f"lone-{i}", "request", name, 0.5)["outcome"] == "waiting"
            after = metric(http, 'calibd_cloudevents_unpaired_dropped_total{half="request",reason="full"}')
            assert after - before == 50
            # The oldest 50 were dropped: their responses wait in turn; the newest still pair.
            assert post(http, "lone-0", "response", name, 0.5)["outcome"] == "waiting"
            assert post(http, "lone-149", "response", name, 0.5)["outcome"] == "paired"


def test_the_kserve_logger_manifest_points_at_this_route():
    """deploy/kserve/payload-logger.yaml, checked by the fields KServe's LoggerSpec has
    (pkg/apis/serving/v1beta1/inference_service.go: url, mode) and against calibd's own routes."""
    from urllib.parse import parse_qs, urlsplit

    import yaml

    from calibd.main import create_app

    from .conftest import REPO

    (service,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "kserve" / "payload-logger.yaml").read_text()) if d]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
    logger = service["spec"]["predictor"]["logger"]
    assert set(logger) <= {"url", "mode", "metadataHeaders", "metadataAnnotations", "storage"}
    assert logger["mode"] == "all"  # a prediction is logged when both halves are here
    url = urlsplit(logger["url"])
    route = create_app(Settings(database_url="sqlite://")).openapi()["paths"][url.path]["post"]
    assert {p["name"] for p in route["parameters"]} >= set(parse_qs(url.query))
    assert parse_qs(url.query)["calibrator"] == [service["metadata"]["name"]]
    assert service["spec"]["predictor"]["model"]["protocolVersion"] == "v2"


def test_halves_sent_to_two_serve_processes_pair_through_the_database(database_url, tmp_path):
    """Two `calibd serve` processes on one database, as two replicas behind a Service that does not
    hash on ce-id. Of each pair, one half goes to one process and the other half to the other, in
    either order (and a tenth of the halves twice, to either): each half waits where it came, moves to
    the database after CALIBD_CLOUDEVENTS_SHARE_SECONDS, and the second to move pairs with the first.
    Labelled by ce-id, the pairs give the monitors of the same scores sent to /calibrate with ids;
    nothing is left in the table of halves."""
    import subprocess
    import sys

    from sqlalchemy import create_engine, text

    from .conftest import REPO
    from .processes import free_port, stop, wait_ready

    n = 300
    logged, direct = f"ce-{uuid.uuid4().hex[:8]}", f"ids-{uuid.uuid4().hex[:8]}"
    env = {**__import__("os").environ, "CALIBD_DATABASE_URL": database_url, "CALIBD_JSON_LOGS": "false",
           "CALIBD_CLOUDEVENTS_SHARE_SECONDS": "0.5"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    servers, urls = [], []
    try:
        for k in range(2):
            port = free_port()
            log = open(tmp_path / f"serve-{k}.log", "wb")
            servers.append(subprocess.Popen([sys.executable, "-m", "calibd.cli", "serve", "--port", str(port)],
                                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
            wait_ready(servers[-1], urls[-1] + "/readyz", 120, "calibd serve", (tmp_path / f"serve-{k}.log").read_text)
        rng = np.random.default_rng(3)
        scores = rng.uniform(0.01, 0.99, n)
        labels = (rng.uniform(size=n) < scores).astype(int)
        ids = [str(uuid.uuid4()) for _ in range(n)]
        order = random.Random(7)
        twice = set()
        with httpx.Client(base_url=urls[0], timeout=60) as a, httpx.Client(base_url=urls[1], timeout=60) as b:
            fit_platt_over_http(a, logged)
            fit_platt_over_http(a, direct)
            for i in range(n):
                first, second = (a, b) if order.random() < 0.5 else (b, a)
                halves = [(first, "request"), (second, "response")]
                if order.random() < 0.2:
                    halves.reverse()
                if order.random() < 0.1:
                    halves.append((order.choice([a, b]), order.choice(["request", "response"])))
                    twice.add(ids[i])
                for http, kind in halves:
                    post(http, ids[i], kind, logged, float(scores[i]))

            def paired() -> float:
                """Pairs logged: through the database, and in a process (a half sent again to the other)."""
                samples = ['calibd_cloudevents_shared_total{outcome="paired"}',
                           'calibd_cloudevents_total{half="request",outcome="paired"}',
                           'calibd_cloudevents_total{half="response",outcome="paired"}']
                return sum(metric(http, sample) for http in (a, b) for sample in samples)

            deadline = time.monotonic() + 60
            while paired() < n:
                assert time.monotonic() < deadline, f"{paired()} of {n} pairs logged"
                time.sleep(0.2)
            assert paired() == n
            answer = a.post("/calibrate", json={"calibrator": direct, "scores": scores.tolist(), "ids": ids})
            assert answer.status_code == 200, answer.text
            time.sleep(1.0)  # both prediction logs are written every 0.2 s
            for name in (logged, direct):
                answer = a.post("/feedback", json={"calibrator": name, "ids": ids, "labels": labels.tolist()})
                assert answer.status_code == 202 and answer.json()["count"] == n and answer.json()["pending"] == 0, answer.text
            got, expected = monitor(a, logged), monitor(a, direct)
            assert got["windows"]["1h"]["samples"] == n
            assert_same_monitors(got, expected)
    finally:
        for server in servers:
            stop(server)
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            left = connection.execute(text(
                "SELECT h.event_id FROM cloudevent_halves h JOIN calibrators c ON c.id = h.calibrator_id WHERE c.name = :name"
            ), {"name": logged}).scalars().all()
    finally:
        engine.dispose()
    # Only a half sent again after its pair was logged is left, to wait there until it is too old.
    assert set(left) <= twice


def test_two_processes_moving_each_others_halves_at_once_pair_every_id_once(fresh_database):
    """Replica A moves the request halves of some ids while replica B moves their response halves, each
    in its own arrival order (here, opposite ones). Every id pairs exactly once, in one replica, and no
    exchange fails: before the halves were written in one order, PostgreSQL found a deadlock in such
    rounds and aborted one exchange, and every half it carried was lost."""
    import threading
    from datetime import datetime, timezone

    from calibd.storage import cloudevent_halves
    from calibd.storage.db import make_engine, make_sessionmaker

    engine = make_engine(fresh_database)
    sessions = make_sessionmaker(engine)
    info = stored_platt_version(sessions, "exchange")
    try:
        for round_ in range(60):
            ids = [f"r{round_}-{i}" for i in range(30)]
            now = datetime.now(timezone.utc)
            requests = [{"calibrator_id": info.calibrator_id, "event_id": i, "half": "request", "scores": None,
                         "received_at": now} for i in ids]
            responses = [{"calibrator_id": info.calibrator_id, "event_id": i, "half": "response", "scores": [0.4],
                          "received_at": now} for i in reversed(ids)]
            start = threading.Barrier(2)
            results, errors = [], []

            def move(halves) -> None:
                start.wait()
                try:
                    results.append(cloudevent_halves.exchange(sessions, halves, None))
                except Exception as error:
                    errors.append(error)

            threads = [threading.Thread(target=move, args=(halves,)) for halves in (requests, responses)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == [], (round_, errors)
            paired = [event_id for result in results for (_, event_id) in result.paired]
            assert sorted(paired) == sorted(ids), round_
    finally:
        engine.dispose()
