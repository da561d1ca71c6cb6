"""Transformer mode end to end: tritonclient -> calibd -> a real MLServer serving a scikit-learn classifier.

The classifier's outputs come back with calibrated ``probabilities`` added, equal bit for bit to
/calibrate's on the classifier's raw output; feedback by the logged ids is joined. The predictor is
the default (``--predictor``), or one stored with the calibrator (PUT /calibrators/{name}/predictor)
reached over REST or over gRPC, with the same numbers. A predictor that is down answers 502, one
that is too slow 504 (over either protocol), and calibd stays healthy.
"""

from __future__ import annotations

import socket
import threading

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from calibd.config import PredictorSetting, Settings

from .conftest import LiveServer
from .mlserver_env import MLServer
from .predictor_errors import PredictorErrors
from .oip_cases import assert_bit_identical, assert_feedback_joined, calibrate

MODEL = "classifier"


@pytest.fixture(scope="module")
def mlserver(tmp_path_factory):
    with MLServer(tmp_path_factory.mktemp("mlserver"), MODEL) as server:
        yield server


@pytest.fixture(scope="module")
def silent_port():
    """A predictor that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


@pytest.fixture(scope="module")
def refusing_port():
    """A predictor that is down: a port held bound without listening (connections are refused),
    so that no server started later can be given it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    yield held.getsockname()[1]
    held.close()


@pytest.fixture(scope="module")
def calibd(mlserver, silent_port, refusing_port, isolated_database_url):
    predictors = {
        "down": PredictorSetting(url=f"http://127.0.0.1:{refusing_port}", model=MODEL),
        "slow": PredictorSetting(url=f"http://127.0.0.1:{silent_port}", model=MODEL),
    }
    settings = Settings(
        database_url=isolated_database_url, predictor_url=mlserver.url, predictors=predictors, predictor_timeout_seconds=1.0,
        predictor_allow="127.0.0.1",
    )
    with LiveServer(settings) as live:
        yield live


def features(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4))


def ask(url: str, x: np.ndarray, outputs=("predict_proba",), binary=False, model=MODEL, binary_inputs=False, **kwargs):
    """tritonclient's call; ``binary``: the outputs as binary data; ``binary_inputs``: the inputs
    too (calibd's own ones: MLServer takes its REST inputs as JSON only)."""
    client = triton.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)
    try:
        tensor = triton.InferInput("input-0", list(x.shape), "FP64")
        tensor.set_data_from_numpy(x, binary_data=binary_inputs)
        requested = [triton.InferRequestedOutput(o, binary_data=binary) for o in outputs]
        return client.infer(model, [tensor], outputs=requested, **kwargs)
    finally:
        client.close()


#: Calibrators whose predictor is stored with them: the classifier over REST and over gRPC, and
#: gRPC predictors that are down or too slow.
STORED = ("stored-rest", "stored-grpc", "grpc-down", "grpc-slow")


@pytest.fixture(scope="module")
def fitted(calibd, mlserver, silent_port, refusing_port):
    """Isotonic calibrators fitted on the classifier's own probabilities for a holdout: one named as
    the model (the default predictor), and those of STORED with their predictors."""
    x = features(2000, 1)
    raw = ask(mlserver.url, x).as_numpy("predict_proba")[:, 1]
    rng = np.random.default_rng(2)
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] * x[:, 3] + rng.normal(scale=0.8, size=2000) > 0).astype(int)
    stored = {
        "stored-rest": mlserver.url, "stored-grpc": mlserver.grpc_url,
        "grpc-down": f"grpc://127.0.0.1:{refusing_port}", "grpc-slow": f"grpc://127.0.0.1:{silent_port}",
    }
    with httpx.Client(base_url=calibd.url, timeout=120) as http:
        for name in (MODEL, "down", "slow", *STORED):
            body = {"name": name, "method": "isotonic", "holdout": {"scores": raw.tolist(), "labels": y.tolist()}}
            assert http.post("/calibrators", json=body).status_code == 201
        for name, url in stored.items():
            response = http.put(f"/calibrators/{name}/predictor", json={"url": url, "model": MODEL})
            assert response.status_code == 200, response.text


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
def test_calibd_returns_the_classifier_outputs_with_calibrated_probabilities(calibd, mlserver, fitted, client_for, binary):
    x = features(100, 3 + binary)
    direct = ask(mlserver.url, x).as_numpy("predict_proba")
    result = ask(calibd.url, x, outputs=("predict_proba", "probabilities"), binary=binary, request_id="t-1")
    np.testing.assert_array_equal(result.as_numpy("predict_proba"), direct)
    expected = calibrate(client_for, MODEL, direct[:, 1])["probabilities"]
    assert_bit_identical(result.as_numpy("probabilities"), expected)
    response = result.get_response()
    assert response["model_name"] == MODEL and response["model_version"] == "1" and response["id"] == "t-1"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
def test_a_stored_predictor_over_rest_or_grpc_gives_the_same_numbers(calibd, mlserver, fitted, client_for, binary):
    x = features(120, 11 + binary)
    direct = ask(mlserver.url, x).as_numpy("predict_proba")
    expected = calibrate(client_for, MODEL, direct[:, 1])["probabilities"]
    for name in (MODEL, "stored-rest", "stored-grpc"):
        result = ask(calibd.url, x, outputs=("predict_proba", "probabilities"), binary=binary, model=name,
                     binary_inputs=binary, request_id=f"{name}-1")
        np.testing.assert_array_equal(result.as_numpy("predict_proba"), direct, err_msg=name)
        assert_bit_identical(result.as_numpy("probabilities"), expected)
        assert_bit_identical(result.as_numpy("probabilities"), calibrate(client_for, name, direct[:, 1])["probabilities"])
        response = result.get_response()
        assert response["model_name"] == name and response["id"] == f"{name}-1"


def test_feedback_by_ids_logged_through_a_grpc_predictor(calibd, mlserver, fitted, client_for):
    x = features(60, 13)
    ids = [f"over-grpc-{i}" for i in range(60)]
    body = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [60, 4], "data": x.ravel().tolist()}],
            "parameters": {"ids": ids}}
    answer = client_for.post("/v2/models/stored-grpc/infer", json=body)
    assert answer.status_code == 200, answer.text
    outputs = {tensor["name"]: tensor for tensor in answer.json()["outputs"]}
    assert sorted(outputs) == ["predict_proba", "probabilities"]
    direct = ask(mlserver.url, x).as_numpy("predict_proba")
    assert outputs["predict_proba"]["shape"] == [60, 2] and outputs["predict_proba"]["data"] == direct.ravel().tolist()
    labels = (np.random.default_rng(14).uniform(size=60) < direct[:, 1]).astype(int)
    assert_feedback_joined(client_for, "stored-grpc", ids, labels.tolist())


def test_default_outputs_and_feedback_by_logged_ids(calibd, mlserver, fitted, client_for):
    x = features(80, 5)
    ids = [f"transformed-{i}" for i in range(80)]
    client = triton.InferenceServerClient(calibd.url.removeprefix("http://"), network_timeout=60)
    tensor = triton.InferInput("input-0", [80, 4], "FP64")
    tensor.set_data_from_numpy(x)
    result = client.infer(MODEL, [tensor], parameters={"ids": ids})  # no outputs named
    client.close()
    direct = ask(mlserver.url, x).as_numpy("predict_proba")
    assert_bit_identical(result.as_numpy("probabilities"), calibrate(client_for, MODEL, direct[:, 1])["probabilities"])
    labels = (np.random.default_rng(6).uniform(size=80) < direct[:, 1]).astype(int)
    assert_feedback_joined(client_for, MODEL, ids, labels.tolist())


def test_scores_input_is_calibrated_directly_even_with_a_predictor(calibd, fitted, client_for):
    scores = np.linspace(0.05, 0.95, 20)
    body = {"inputs": [{"name": "scores", "datatype": "FP64", "shape": [20], "data": scores.tolist()}]}
    answer = client_for.post(f"/v2/models/{MODEL}/infer", json=body).json()
    assert answer["outputs"][0]["data"] == calibrate(client_for, MODEL, scores)["probabilities"]


def test_predictor_down_or_slow_is_502_or_504_and_calibd_stays_healthy(
    calibd, mlserver, fitted, client_for, refusing_port, silent_port
):
    body = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [2, 4], "data": features(2, 7).ravel().tolist()}]}
    with PredictorErrors() as logged:  # the caller gets a reason and an error id; the log, where and what
        down = client_for.post("/v2/models/down/infer", json=body)
        assert down.status_code == 502 and "could not be reached" in down.json()["error"], down.text
        assert f"127.0.0.1:{refusing_port}" in logged.of(down).predictor
        slow = client_for.post("/v2/models/slow/infer", json=body)
        assert slow.status_code == 504 and "did not answer in time" in slow.json()["error"], slow.text
        assert f"127.0.0.1:{silent_port}" in logged.of(slow).predictor
        assert client_for.post("/v2/models/no-such-model/infer", json=body).status_code == 404
        bad = {"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [2, 3], "data": [0.0] * 6}]}
        refused = client_for.post(f"/v2/models/{MODEL}/infer", json=bad)
        assert refused.status_code == 502 and "the predictor answered HTTP 5" in refused.json()["error"], refused.text
        record = logged.of(refused)  # MLServer's own error text is logged, not sent on
        assert mlserver.url in record.predictor and record.detail, record.detail
        down = client_for.post("/v2/models/grpc-down/infer", json=body)
        assert down.status_code == 502, down.text
        assert logged.of(down).predictor.startswith(f"grpc://127.0.0.1:{refusing_port}")
        slow = client_for.post("/v2/models/grpc-slow/infer", json=body)
        assert slow.status_code == 504, slow.text
        assert logged.of(slow).predictor.startswith(f"grpc://127.0.0.1:{silent_port}")
        refused = client_for.post("/v2/models/stored-grpc/infer", json=bad)
        assert refused.status_code == 502 and "the predictor answered INTERNAL" in refused.json()["error"], refused.text
        assert logged.of(refused).predictor.startswith(mlserver.grpc_url)
    assert client_for.get("/v2/health/live").status_code == 200
    assert client_for.get("/v2/health/ready").status_code == 200
    assert ask(calibd.url, features(3, 8), outputs=("probabilities",)).as_numpy("probabilities").shape == (3,)


@pytest.fixture
def client_for(calibd):
    with httpx.Client(base_url=calibd.url, timeout=60) as http:
        yield http
