"""The Open Inference Protocol over gRPC, called by Triton's own client (tritonclient[grpc]).

calibd serves ``inference.GRPCInferenceService`` on a second port of the same process; every
answer is compared with /calibrate's for the same scores, bit for bit.
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from calibd import __version__
from calibd.config import Settings
from calibd.grpc_v2 import DESCRIPTOR_FILE
from calibd.storage import keys
from calibd.storage.db import make_engine, make_sessionmaker

from .conftest import LiveServer
from .oip_cases import assert_bit_identical, assert_feedback_joined, calibrate, fit_models, overconfident_binary, overconfident_multiclass


@pytest.fixture(scope="module")
def grpc_server(isolated_database_url):
    """calibd with keys (auth on) and the gRPC port; yields the server, its gRPC address and keys."""
    sessions = make_sessionmaker(make_engine(isolated_database_url))
    issued = {scope: keys.create_key(sessions, [scope])[0] for scope in ("admin", "calibrate", "read", "feedback")}
    with LiveServer(Settings(database_url=isolated_database_url, grpc_port=0)) as live:
        address = f"127.0.0.1:{live.server.config.app.state.grpc_port}"
        yield live, address, issued


@pytest.fixture(scope="module")
def models(grpc_server):
    live, _, issued = grpc_server
    return fit_models(live.url, {"Authorization": f"Bearer {issued['admin']}"})


@pytest.fixture
def http(grpc_server):
    live, _, issued = grpc_server
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {issued['admin']}"}, timeout=60) as client:
        yield client


@pytest.fixture
def triton_client(grpc_server):
    _, address, _ = grpc_server
    client = triton.InferenceServerClient(address)
    yield client
    client.close()


def bearer(issued, scope="calibrate"):
    return {"authorization": f"Bearer {issued[scope]}"}


def infer(client, headers, name, array, outputs=("probabilities",), datatype=None, **kwargs):
    tensor = triton.InferInput("scores", list(array.shape), datatype or ("FP32" if array.dtype == np.float32 else "FP64"))
    tensor.set_data_from_numpy(array)
    requested = [triton.InferRequestedOutput(output) for output in outputs]
    return client.infer(name, [tensor], outputs=requested, headers=headers, **kwargs)


def test_health_and_metadata(triton_client, grpc_server, models):
    _, _, issued = grpc_server
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    metadata = triton_client.get_server_metadata(as_json=True)
    assert metadata["name"] == "calibd" and metadata["version"] == __version__
    binary = triton_client.get_model_metadata(models["binary"], headers=bearer(issued, "read"), as_json=True)
    assert binary["versions"] == ["1", "2"]
    assert {"name": "scores", "datatype": "FP64", "shape": ["-1"]} in binary["inputs"]  # int64 as JSON strings
    multiclass = triton_client.get_model_metadata(models["multiclass"], headers=bearer(issued), as_json=True)
    assert {"name": "probabilities", "datatype": "FP64", "shape": ["-1", "3"]} in multiclass["outputs"]
    assert triton_client.is_model_ready(models["binary"], headers=bearer(issued))
    assert triton_client.is_model_ready(models["binary"], model_version="1", headers=bearer(issued))
    assert not triton_client.is_model_ready(models["binary"], model_version="7", headers=bearer(issued))
    assert not triton_client.is_model_ready("no-such-model", headers=bearer(issued))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["FP64", "FP32"])
@pytest.mark.parametrize("n", [1, 100, 10_000])
def test_binary_calibrator_equals_calibrate_bit_for_bit(triton_client, grpc_server, http, models, dtype, n):
    _, _, issued = grpc_server
    scores, _ = overconfident_binary(n, 20 + n)
    result = infer(triton_client, bearer(issued), models["binary"], scores.astype(dtype), request_id="g-1")
    assert_bit_identical(result.as_numpy("probabilities"), calibrate(http, models["binary"], scores.astype(dtype).astype(np.float64))["probabilities"])
    response = result.get_response(as_json=True)
    assert response["id"] == "g-1" and response["model_version"] == "2"


def test_versions_multiclass_decisions_and_extras(triton_client, grpc_server, http, models):
    _, _, issued = grpc_server
    scores, _ = overconfident_binary(200, 3)
    result = infer(triton_client, bearer(issued), models["binary"], scores, model_version="1")
    assert_bit_identical(result.as_numpy("probabilities"), calibrate(http, models["binary"], scores, version=1)["probabilities"])
    z, _ = overconfident_multiclass(300, 3, 4)
    costs = [[0, 1, 4], [1, 0, 1], [2, 1, 0]]
    result = infer(
        triton_client, bearer(issued), models["multiclass"], z, outputs=("probabilities", "decisions"),
        parameters={"costs": '[[0, 1, 4], [1, 0, 1], [2, 1, 0]]'},
    )
    expected = calibrate(http, models["multiclass"], z, costs=costs)
    assert_bit_identical(result.as_numpy("probabilities"), expected["probabilities"])
    assert [d.decode() for d in result.as_numpy("decisions")] == expected["decisions"]
    tensor = triton.InferInput("scores", [200], "FP64")
    tensor.set_data_from_numpy(scores)
    result = triton_client.infer(models["venn"], [tensor], headers=bearer(issued))  # every output
    expected = calibrate(http, models["venn"], scores)
    assert_bit_identical(result.as_numpy("intervals"), expected["intervals"])
    assert_bit_identical(result.as_numpy("probabilities"), expected["probabilities"])


def test_ids_input_is_logged_for_feedback(triton_client, grpc_server, http, models):
    _, _, issued = grpc_server
    scores, labels = overconfident_binary(40, 5)
    ids = [f"grpc-{i}" for i in range(40)]
    tensor = triton.InferInput("scores", [40], "FP64")
    tensor.set_data_from_numpy(scores)
    id_tensor = triton.InferInput("ids", [40], "BYTES")
    id_tensor.set_data_from_numpy(np.array(ids, dtype=object))
    triton_client.infer(models["binary"], [tensor, id_tensor], headers=bearer(issued))
    assert_feedback_joined(http, models["binary"], ids, labels.tolist())


def test_auth_and_errors_map_to_status_codes(triton_client, grpc_server, models):
    _, _, issued = grpc_server
    scores = np.array([0.3, 0.6])
    cases = [
        ({}, models["binary"], scores, "FP64", "StatusCode.UNAUTHENTICATED"),
        ({"authorization": "Bearer calibd_deadbeef_wrong"}, models["binary"], scores, "FP64", "StatusCode.UNAUTHENTICATED"),
        (bearer(issued, "read"), models["binary"], scores, "FP64", "StatusCode.PERMISSION_DENIED"),
        (bearer(issued, "feedback"), models["binary"], scores, "FP64", "StatusCode.PERMISSION_DENIED"),
        (bearer(issued), "no-such-model", scores, "FP64", "StatusCode.NOT_FOUND"),
        (bearer(issued), models["binary"], np.array([0.3, 1.5]), "FP64", "StatusCode.INVALID_ARGUMENT"),
        (bearer(issued), models["binary"], np.array([[0.3, 0.7]]), "FP64", "StatusCode.INVALID_ARGUMENT"),
        (bearer(issued), models["binary"], np.array([1, 0], dtype=np.int32), "INT32", "StatusCode.INVALID_ARGUMENT"),
    ]
    for headers, name, array, datatype, status in cases:
        with pytest.raises(InferenceServerException) as caught:
            infer(triton_client, headers, name, array, datatype=datatype)
        assert caught.value.status() == status, (name, array, caught.value)
    with pytest.raises(InferenceServerException) as caught:
        triton_client.get_model_metadata(models["binary"], headers={})
    assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
    assert triton_client.is_server_live()


def test_the_checked_in_descriptor_is_the_proto_compiled(tmp_path):
    """grpc_predict_v2.pb is what grpc_tools' protoc makes of grpc_predict_v2.proto today."""
    output = tmp_path / "compiled.pb"
    folder = DESCRIPTOR_FILE.parent
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"--descriptor_set_out={output}", str(folder / "grpc_predict_v2.proto")],
        check=True,
    )
    assert output.read_bytes() == DESCRIPTOR_FILE.read_bytes()


def test_calibd_serve_grpc_port_with_two_workers(tmp_path):
    """`calibd serve --grpc-port` serves gRPC from each worker process on the one port."""
    from .conftest import free_port, migrated_database
    from .reliability.harness import PYTHON, REPO

    with migrated_database("sqlite", tmp_path) as url:
        port, grpc_port = free_port(), free_port()
        while grpc_port == port:  # two free ports, not one twice
            grpc_port = free_port()
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("CALIBD_")} | {"CALIBD_DATABASE_URL": url}
        log = open(tmp_path / "serve.log", "w")
        process = subprocess.Popen(
            [PYTHON, "-m", "calibd.cli", "serve", "--port", str(port), "--grpc-port", str(grpc_port), "--workers", "2"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
            scores, labels = overconfident_binary(300, 8)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                body = {"name": "served", "method": "platt", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
                assert http.post("/calibrators", json=body).status_code == 201
                expected = calibrate(http, "served", scores)["probabilities"]
            for _ in range(4):  # new connections: each lands on either worker
                client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
                try:
                    assert_bit_identical(infer(client, {}, "served", scores).as_numpy("probabilities"), expected)
                finally:
                    client.close()
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.close()
