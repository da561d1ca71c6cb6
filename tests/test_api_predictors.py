"""A calibrator's stored predictor (transformer mode) through the API, on SQLite and PostgreSQL:
PUT, GET and DELETE /calibrators/{name}/predictor, its checks, its precedence over
CALIBD_PREDICTORS and the default, a change served by another process within a second, and the
client's and the CLI's commands.

Where a request goes is seen from calibd's log: a predictor that is down answers 502 with an error
id, and the log line of that id names the URL (the caller is never told it). (Forwarding to a real
model server: tests/test_oip_transformer.py; the allow-list and hostile predictors:
tests/test_predictor_ssrf.py.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from calibd.client import AsyncClient, Client, InvalidInput, NotFound
from calibd.config import PredictorSetting, Settings

from .conftest import REPO, LiveServer
from .predictor_errors import PredictorErrors
from .test_api_feedback import fit

REQUEST = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [1, 2], "data": [0.5, 1.5]}]}


@pytest.fixture(scope="module")
def down_ports():
    """Ports held bound without listening: a predictor there is down (connections are refused)."""
    held = [socket.socket() for _ in range(3)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    yield [s.getsockname()[1] for s in held]
    for s in held:
        s.close()


#: calibd's log lines about predictor failures, by error id (read while this module runs).
LOGGED = PredictorErrors()


@pytest.fixture(scope="module", autouse=True)
def _logged():
    with LOGGED:
        yield


def forwarded_to(http: httpx.Client, name: str) -> str | None:
    """The upstream a /v2 infer request without scores went to (as calibd's log names it under the
    502's error id), or None if it was not forwarded (calibd asked for scores)."""
    response = http.post(f"/v2/models/{name}/infer", json=REQUEST)
    if response.status_code == 422:
        assert "scores" in response.json()["error"], response.text
        return None
    assert response.status_code == 502, response.text
    assert response.json()["error"].startswith("the predictor could not be reached (error id "), response.text
    return LOGGED.of(response).predictor


def test_put_get_delete(client, name, down_ports):
    fit(client, name)
    assert client.get(f"/calibrators/{name}/predictor").json() == {"calibrator": name, "stored": None, "effective": None}
    url = f"http://127.0.0.1:{down_ports[0]}/serving"
    put = client.put(f"/calibrators/{name}/predictor", json={"url": url + "/"})
    assert put.status_code == 200, put.text
    expected = {
        "calibrator": name,
        "stored": {"url": url, "model": None, "output": None},
        "effective": {"url": url, "model": name, "output": "predict_proba", "source": "calibrator"},
    }
    assert put.json() == expected
    assert client.get(f"/calibrators/{name}/predictor").json() == expected
    assert f"{url}/v2/models/{name}/infer" in forwarded_to(client, name)

    grpc_url = f"grpc://127.0.0.1:{down_ports[1]}"
    body = {"url": grpc_url, "model": "classifier", "output": "logits"}
    assert client.put(f"/calibrators/{name}/predictor", json=body).json()["effective"] == body | {"source": "calibrator"}
    assert f"{grpc_url} (ModelInfer of classifier)" in forwarded_to(client, name)

    deleted = client.delete(f"/calibrators/{name}/predictor")
    assert deleted.status_code == 200 and deleted.json() == {"calibrator": name, "stored": None, "effective": None}
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"] is None
    assert forwarded_to(client, name) is None
    # Deleting the calibrator deletes its predictor: a calibrator fitted again under the name has none.
    client.put(f"/calibrators/{name}/predictor", json={"url": url})
    assert client.delete(f"/calibrators/{name}").status_code == 204
    fit(client, name)
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"] is None
    assert forwarded_to(client, name) is None


@pytest.mark.parametrize(
    "body, pointer",
    [
        ({"url": "ftp://127.0.0.1:8080"}, "/url"),
        ({"url": "127.0.0.1:8080"}, "/url"),
        ({"url": "http://:8080"}, "/url"),
        ({"url": "http://127.0.0.1:port"}, "/url"),
        ({"url": "grpc://127.0.0.1"}, "/url"),
        ({"url": "grpc://127.0.0.1:8081/v2"}, "/url"),
        ({"url": "http://127.0.0.1:8080?model=x"}, "/url"),
        ({"url": 8080}, "/url"),
        ({}, "/url"),
        ({"url": "http://127.0.0.1:8080", "model": "a/b"}, "/model"),
        ({"url": "http://127.0.0.1:8080", "output": ""}, "/output"),
        ({"url": "http://127.0.0.1:8080", "timeout": 3}, "/timeout"),
    ],
)
def test_a_bad_predictor_is_422_naming_the_field_and_writes_nothing(client, name, row_counts, down_ports, body, pointer):
    fit(client, name)
    url = f"http://127.0.0.1:{down_ports[0]}"
    client.put(f"/calibrators/{name}/predictor", json={"url": url})
    before = row_counts()
    response = client.put(f"/calibrators/{name}/predictor", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == pointer
    assert row_counts() == before
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"]["url"] == url


def test_a_fit_stores_the_predictor_it_names_with_its_version(client, name, down_ports, row_counts):
    url = f"http://127.0.0.1:{down_ports[0]}"
    fit(client, name, predictor={"url": url, "output": "logits"})
    stored = client.get(f"/calibrators/{name}/predictor").json()
    assert stored["stored"] == {"url": url, "model": None, "output": "logits"}
    assert f"{url}/v2/models/{name}/infer" in forwarded_to(client, name)
    # A later fit without one keeps it; one with another replaces it.
    fit(client, name, seed=1)
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"]["url"] == url
    grpc_url = f"grpc://127.0.0.1:{down_ports[1]}"
    fit(client, name, seed=2, predictor={"url": grpc_url})
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"]["url"] == grpc_url
    # A bad one is refused with the fit: no version, and the stored predictor as it was.
    before = row_counts()
    holdout = {"scores": [0.2, 0.4, 0.6, 0.8] * 10, "labels": [0, 0, 1, 1] * 10}
    for predictor, pointer in (({"url": "ftp://127.0.0.1:1"}, "/predictor/url"), ({"url": url, "mode": "x"}, "/predictor/mode")):
        response = client.post("/calibrators", json={"name": name, "method": "platt", "holdout": holdout, "predictor": predictor})
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["pointer"] == pointer
    assert row_counts() == before
    assert client.get(f"/calibrators/{name}").json()["latest_version"] == 3
    assert client.get(f"/calibrators/{name}/predictor").json()["stored"]["url"] == grpc_url


def test_unknown_calibrator_bad_name_and_bad_body(client, name):
    body = {"url": "http://127.0.0.1:8080"}
    for response in (
        client.get("/calibrators/no-such-calibrator/predictor"),
        client.put("/calibrators/no-such-calibrator/predictor", json=body),
        client.delete("/calibrators/no-such-calibrator/predictor"),
    ):
        assert response.status_code == 404, response.text
    assert client.put("/calibrators/Not_A_Name/predictor", json=body).status_code == 422
    fit(client, name)
    assert client.put(f"/calibrators/{name}/predictor", content=b"url=x", headers={"content-type": "text/plain"}).status_code == 415
    assert client.put(f"/calibrators/{name}/predictor", content=b"[1]", headers={"content-type": "application/json"}).status_code == 400


def test_stored_then_calibd_predictors_then_the_default(database_url, down_ports):
    named, default, stored = (f"http://127.0.0.1:{port}" for port in down_ports)
    settings = Settings(
        database_url=database_url, predictor_url=default, predictor_output="logits", predictor_allow="127.0.0.1",
        predictors={"named-one": PredictorSetting(url=named, model="m", output="proba")},
    )
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        for calibrator in ("named-one", "plain-one"):
            http.delete(f"/calibrators/{calibrator}")
            fit(http, calibrator)
        assert http.get("/calibrators/named-one/predictor").json()["effective"] == {
            "url": named, "model": "m", "output": "proba", "source": "CALIBD_PREDICTORS",
        }
        assert http.get("/calibrators/plain-one/predictor").json()["effective"] == {
            "url": default, "model": "plain-one", "output": "logits", "source": "CALIBD_PREDICTOR_URL",
        }
        assert f"{named}/v2/models/m/infer" in forwarded_to(http, "named-one")
        assert f"{default}/v2/models/plain-one/infer" in forwarded_to(http, "plain-one")
        for calibrator in ("named-one", "plain-one"):
            http.put(f"/calibrators/{calibrator}/predictor", json={"url": stored})
            assert f"{stored}/v2/models/{calibrator}/infer" in forwarded_to(http, calibrator)
            assert http.get(f"/calibrators/{calibrator}/predictor").json()["effective"]["output"] == "logits"
        http.delete("/calibrators/named-one/predictor")
        assert f"{named}/v2/models/m/infer" in forwarded_to(http, "named-one")


def test_a_change_reaches_another_process_within_a_second(server, database_url, name, down_ports):
    first, second = (f"http://127.0.0.1:{port}" for port in down_ports[:2])
    with (
        LiveServer(Settings(database_url=database_url, predictor_allow="127.0.0.1")) as other,
        httpx.Client(base_url=server.url, timeout=60) as a,
        httpx.Client(base_url=other.url, timeout=60) as b,
    ):
        fit(a, name)
        assert forwarded_to(b, name) is None  # b has loaded the calibrator, and knows of no predictor
        for url in (first, second, None):
            if url is None:
                assert a.delete(f"/calibrators/{name}/predictor").status_code == 200
            else:
                assert a.put(f"/calibrators/{name}/predictor", json={"url": url}).status_code == 200
            changed = time.monotonic()

            def sees(http: httpx.Client) -> bool:
                upstream = forwarded_to(http, name)
                return upstream is None if url is None else upstream is not None and url in upstream

            assert sees(a)  # the process that made the change: on the next request
            while not sees(b):
                assert time.monotonic() - changed < 1.0, f"the other process does not forward to {url} after 1 s"
                time.sleep(0.01)


def test_the_clients_and_the_cli(server, name, tmp_path):
    url = "grpc://127.0.0.1:8081"
    with Client(server.url) as client:
        client.fit(name, [0.2, 0.8] * 20, [0, 1] * 20, method="platt")
        assert client.predictor(name) == {"calibrator": name, "stored": None, "effective": None}
        out = client.set_predictor(name, url, model="classifier")
        assert out["effective"] == {"url": url, "model": "classifier", "output": "predict_proba", "source": "calibrator"}
        with pytest.raises(InvalidInput) as bad:
            client.set_predictor(name, "ftp://127.0.0.1")
        assert bad.value.errors[0]["pointer"] == "/url"
        with pytest.raises(NotFound):
            client.predictor("no-such-calibrator")
        assert client.delete_predictor(name)["stored"] is None
        # A fit can name its predictor (and its segments) itself.
        client.fit(name, [0.2, 0.8] * 20, [0, 1] * 20, method="platt", predictor={"url": url, "model": "m"},
                   segments={"dimensions": ["country"]})
        assert client.predictor(name)["stored"] == {"url": url, "model": "m", "output": None}
        assert client.delete_predictor(name)["stored"] is None

    async def run() -> dict:
        async with AsyncClient(server.url) as calibd:
            await calibd.set_predictor(name, url, output="logits")
            return await calibd.predictor(name)

    assert asyncio.run(run())["stored"] == {"url": url, "model": None, "output": "logits"}

    env = {key: value for key, value in os.environ.items() if not key.startswith("CALIBD_")}
    env |= {"CALIBD_URL": server.url, "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "calibd.cli", "predictor", name, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    shown = cli()
    assert shown.returncode == 0 and shown.stdout == f"{name}: {url}, model {name}, output logits (stored with the calibrator)\n"
    changed = cli("--set", "http://127.0.0.1:8080", "--model", "m", "--output-name", "proba")
    assert changed.stdout == f"{name}: http://127.0.0.1:8080, model m, output proba (stored with the calibrator)\n"
    refused = cli("--set", "grpc://127.0.0.1")
    assert refused.returncode != 0 and refused.stderr.startswith("calibd: ") and "/url" in refused.stderr
    removed = cli("--delete")
    assert removed.returncode == 0 and removed.stdout == f"{name}: no predictor (its /v2 infer requests need scores)\n"
