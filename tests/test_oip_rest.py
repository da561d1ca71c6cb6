"""The Open Inference Protocol over REST, called by Triton's own client (tritonclient[http]).

Every answer is compared with /calibrate's for the same scores, bit for bit: the protocol is
another way into the same batch step, never another computation.
"""

from __future__ import annotations


import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from calibd import __version__

from .oip_cases import assert_bit_identical, assert_feedback_joined, calibrate, fit_models, overconfident_binary, overconfident_multiclass


@pytest.fixture(scope="module")
def models(server):
    return fit_models(server.url)


@pytest.fixture
def triton_client(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


def infer(triton_client, name, scores, dtype, binary, outputs=("probabilities",), **kwargs):
    array = scores.astype(dtype)
    tensor = triton.InferInput("scores", list(array.shape), "FP32" if dtype == np.float32 else "FP64")
    tensor.set_data_from_numpy(array, binary_data=binary)
    requested = [triton.InferRequestedOutput(output, binary_data=binary) for output in outputs]
    return triton_client.infer(name, [tensor], outputs=requested, **kwargs)


def test_health_and_server_metadata(triton_client):
    assert triton_client.is_server_live()
    assert triton_client.is_server_ready()
    metadata = triton_client.get_server_metadata()
    assert metadata["name"] == "calibd" and metadata["version"] == __version__
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_lists_versions_inputs_and_outputs(triton_client, models):
    binary = triton_client.get_model_metadata(models["binary"])
    assert binary["name"] == models["binary"] and binary["versions"] == ["1", "2"]
    assert {"name": "scores", "datatype": "FP64", "shape": [-1]} in binary["inputs"]
    assert {"name": "probabilities", "datatype": "FP64", "shape": [-1]} in binary["outputs"]
    multiclass = triton_client.get_model_metadata(models["multiclass"], model_version="1")
    assert {"name": "scores", "datatype": "FP64", "shape": [-1, 3]} in multiclass["inputs"]
    assert {"name": "probabilities", "datatype": "FP64", "shape": [-1, 3]} in multiclass["outputs"]
    assert {"name": "decisions", "datatype": "BYTES", "shape": [-1]} in multiclass["outputs"]
    venn = triton_client.get_model_metadata(models["venn"])
    assert {"name": "intervals", "datatype": "FP64", "shape": [-1, 2]} in venn["outputs"]
    assert triton_client.is_model_ready(models["binary"])
    assert triton_client.is_model_ready(models["binary"], model_version="1")
    assert not triton_client.is_model_ready(models["binary"], model_version="3")
    assert not triton_client.is_model_ready("no-such-model")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["FP64", "FP32"])
@pytest.mark.parametrize("n", [1, 100, 5000])
def test_binary_calibrator_equals_calibrate_bit_for_bit(client, triton_client, models, binary, dtype, n):
    scores, _ = overconfident_binary(n, 10 + n)
    result = infer(triton_client, models["binary"], scores, dtype, binary, request_id="req-7")
    expected = calibrate(client, models["binary"], scores.astype(dtype).astype(np.float64))
    assert_bit_identical(result.as_numpy("probabilities"), expected["probabilities"])
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_name"] == models["binary"] and response["model_version"] == "2"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
def test_versions_are_served_by_number(client, triton_client, models, binary):
    scores, _ = overconfident_binary(300, 5)
    result = infer(triton_client, models["binary"], scores, np.float64, binary, model_version="1")
    assert result.get_response()["model_version"] == "1"
    assert_bit_identical(result.as_numpy("probabilities"), calibrate(client, models["binary"], scores, version=1)["probabilities"])
    assert not np.array_equal(result.as_numpy("probabilities"), calibrate(client, models["binary"], scores)["probabilities"])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
def test_multiclass_calibrator_with_decisions(client, triton_client, models, binary):
    z, _ = overconfident_multiclass(400, 3, 11)
    costs = [[0, 1, 4], [1, 0, 1], [2, 1, 0]]
    result = infer(
        triton_client, models["multiclass"], z, np.float64, binary, outputs=("probabilities", "decisions"),
        parameters={"costs": costs},
    )
    expected = calibrate(client, models["multiclass"], z, costs=costs)
    assert_bit_identical(result.as_numpy("probabilities"), expected["probabilities"])
    assert [d.decode() if isinstance(d, bytes) else d for d in result.as_numpy("decisions")] == expected["decisions"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-data"])
def test_every_output_by_default_with_extras(client, triton_client, models, binary):
    scores, _ = overconfident_binary(250, 12)
    tensor = triton.InferInput("scores", [250], "FP64")
    tensor.set_data_from_numpy(scores, binary_data=binary)
    # No outputs named: tritonclient asks for every output as binary data.
    result = triton_client.infer(models["venn"], [tensor])
    expected = calibrate(client, models["venn"], scores)
    assert_bit_identical(result.as_numpy("probabilities"), expected["probabilities"])
    assert_bit_identical(result.as_numpy("intervals"), expected["intervals"])


def test_ids_in_parameters_are_logged_for_feedback(client, triton_client, models):
    scores, labels = overconfident_binary(60, 13)
    ids = [f"oip-{models['binary']}-{i}" for i in range(60)]
    result = infer(triton_client, models["binary"], scores, np.float64, True, parameters={"ids": ids})
    bytes_ids = [f"oip-bytes-{models['binary']}-{i}" for i in range(60)]
    tensor = triton.InferInput("scores", [60], "FP64")
    tensor.set_data_from_numpy(scores)
    id_tensor = triton.InferInput("ids", [60], "BYTES")
    id_tensor.set_data_from_numpy(np.array(bytes_ids, dtype=object))
    triton_client.infer(models["binary"], [tensor, id_tensor])
    assert_feedback_joined(client, models["binary"], ids + bytes_ids, labels.tolist() * 2)
    assert_bit_identical(result.as_numpy("probabilities"), calibrate(client, models["binary"], scores)["probabilities"])


def oip_post(client, path, body, status):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert isinstance(error["error"], str) and error["status"] == status
    return error


def scores_input(data, datatype="FP64", shape=None):
    return {"name": "scores", "datatype": datatype, "shape": shape or [len(data)], "data": data}


def test_errors_come_in_the_protocol_shape(client, triton_client, models, row_counts):
    before = row_counts()
    with pytest.raises(InferenceServerException, match="does not exist"):
        infer(triton_client, "no-such-model", np.array([0.5]), np.float64, False)
    oip_post(client, "/v2/models/no-such-model/infer", {"inputs": [scores_input([0.5])]}, 404)
    oip_post(client, f"/v2/models/{models['binary']}/versions/9/infer", {"inputs": [scores_input([0.5])]}, 404)
    assert client.get("/v2/models/no-such-model").status_code == 404
    path = f"/v2/models/{models['binary']}/infer"
    # A wrong datatype or a malformed tensor: 400; scores the calibrator refuses: 422, naming them.
    oip_post(client, path, {"inputs": [scores_input([1, 0], "INT32")]}, 400)
    oip_post(client, path, {"inputs": [scores_input([0.5, 0.5], shape=[3])]}, 400)
    oip_post(client, path, {"inputs": [scores_input([0.5], "COMPLEX")]}, 400)
    error = oip_post(client, path, {"inputs": [scores_input([[0.1, 0.9], [0.2, 0.8]], shape=[2, 2])]}, 422)
    assert error["errors"][0]["pointer"].startswith("/scores")
    error = oip_post(client, path, {"inputs": [scores_input([0.5, 1.5])]}, 422)
    assert error["errors"][0]["pointer"] == "/scores/1"
    oip_post(client, path, {"inputs": [{**scores_input([0.5]), "name": "colour"}]}, 422)
    oip_post(client, path, {"inputs": [scores_input([0.5])], "parameters": {"ids": ["a", "b"]}}, 422)
    oip_post(client, path, {"inputs": [scores_input([0.5])], "outputs": [{"name": "colour"}]}, 400)
    response = client.post(path, content=b"{not json")
    assert response.status_code == 400 and "error" in response.json()
    with pytest.raises(InferenceServerException):
        infer(triton_client, models["binary"], np.array([0.2, 2.0]), np.float64, True)
    assert row_counts() == before


def test_binary_data_that_does_not_add_up_is_refused(client, models):
    path = f"/v2/models/{models['binary']}/infer"
    header = b'{"inputs":[{"name":"scores","datatype":"FP64","shape":[2],"parameters":{"binary_data_size":16}}]}'
    good = np.array([0.25, 0.75]).tobytes()
    for body, length in ((header + good[:8], len(header)), (header + good + b"x", len(header)), (header + good, 10**6)):
        response = client.post(path, content=body, headers={"Inference-Header-Content-Length": str(length)})
        assert response.status_code == 400 and "error" in response.json()
    response = client.post(path, content=header + good, headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == calibrate(client, models["binary"], np.array([0.25, 0.75]))["probabilities"]


def test_a_boolean_is_a_malformed_tensor_in_every_shape_and_datatype(client, models):
    """400, as the README says, naming the element: short flat FP64 lists (kept as lists for the
    calibrators' fast path) included."""
    path = f"/v2/models/{models['binary']}/infer"
    for data, datatype, shape, at in (
        ([0.5, True], "FP64", [2], "/1"),
        ([0.5] * 300 + [True], "FP64", [301], "/300"),
        ([0.5, True], "FP32", [2], "/1"),
        ([[0.5, 0.5], [True, 0.5]], "FP64", [2, 2], "/1/0"),
    ):
        error = oip_post(client, path, {"inputs": [scores_input(data, datatype, shape=shape)]}, 400)
        assert error["errors"][0]["pointer"] == "/inputs/0/data" + at, (datatype, shape, error)


def test_data_together_with_binary_data_size_is_refused(client, models):
    path = f"/v2/models/{models['binary']}/infer"
    header = (b'{"inputs":[{"name":"scores","datatype":"FP64","shape":[2],"data":[0.1,0.2],'
              b'"parameters":{"binary_data_size":16}}]}')
    response = client.post(path, content=header + np.array([0.25, 0.75]).tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 400 and response.json()["errors"][0]["pointer"] == "/inputs/0/data"
