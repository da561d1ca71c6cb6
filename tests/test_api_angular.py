"""The angular method through the API, on both databases: a JSON fit for small d, an .npz upload,
calibrate, reload, and bad input (422 naming the field, nothing written)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from calibd.calibration import from_dict
from calibd.calibration.angular import AngularCalibrator

from . import test_angular as simulation

LINK = {"family": "logistic", "scale": 3.0, "offset": 1.0}
OPTIONS = {"lambda": 0.5, "link": LINK}


@pytest.fixture(scope="module")
def small():
    """d = 60 in JSON."""
    return simulation.simulate(21, n=80, d=60, n_holdout=120)


@pytest.fixture(scope="module")
def large():
    """n = 300, d = 600: X and Sigma are 4 MB as an .npz."""
    return simulation.simulate(22, n=300, d=600, n_holdout=150)


def json_holdout(sim, **changes) -> dict:
    holdout = {
        "scores": sim.u_holdout.tolist(),
        "labels": sim.y_holdout.tolist(),
        "X": sim.X.tolist(),
        "y": sim.y.tolist(),
        "w_hat": sim.w_hat.tolist(),
        "Sigma": sim.Sigma.tolist(),
    }
    holdout.update(changes)
    return {key: value for key, value in holdout.items() if value is not None}


def npz_bytes(sim, **changes) -> bytes:
    arrays = {
        "u_holdout": sim.u_holdout, "y_holdout": sim.y_holdout, "X": sim.X, "y": sim.y, "w_hat": sim.w_hat,
        "Sigma": sim.Sigma,
    } | changes
    buffer = io.BytesIO()
    np.savez(buffer, **{key: value for key, value in arrays.items() if value is not None})
    return buffer.getvalue()


def upload(client, name, content: bytes, options=OPTIONS, input="logit"):
    return client.post(
        "/calibrators",
        data={"name": name, "method": "angular", "input": input, "options": json.dumps(options)},
        files={"file": ("train.npz", content, "application/octet-stream")},
    )


def local_fit(sim, **arrays) -> AngularCalibrator:
    arrays = {"X": sim.X, "y": sim.y, "w_hat": sim.w_hat, "Sigma": sim.Sigma} | arrays
    return AngularCalibrator.from_options("logit", OPTIONS).fit(sim.u_holdout, sim.y_holdout, **arrays)


def check_served_and_reloaded(client, name: str, version: int, expected: AngularCalibrator) -> None:
    grid = np.linspace(-6, 6, 49)
    served = client.post("/calibrate", json={"calibrator": name, "version": version, "scores": grid.tolist()})
    assert served.status_code == 200, served.text
    probabilities = np.array(served.json()["probabilities"])
    np.testing.assert_allclose(probabilities, expected.predict(grid), rtol=0, atol=1e-15)
    assert np.all(np.diff(probabilities) >= 0) and np.all((probabilities > 0) & (probabilities < 1))
    stored = client.get(f"/calibrators/{name}/versions/{version}").json()
    assert stored["method"] == "angular" and stored["input"] == "logit"
    parameters = stored["parameters"]
    assert len(json.dumps(parameters)) < 3000  # the learned state, not the training data
    np.testing.assert_array_equal(from_dict(parameters).predict(grid), probabilities)


def test_fit_by_json_then_calibrate_and_reload(client, name, small):
    body = {"name": name, "method": "angular", "input": "logit", "options": OPTIONS, "holdout": json_holdout(small)}
    created = client.post("/calibrators", json=body)
    assert created.status_code == 201, created.text
    out = created.json()
    assert out["method"] == "angular" and out["n_samples"] == 120
    info = out["summary"]["fit"]
    expected = local_fit(small)
    assert info["angle"] == pytest.approx(expected.theta_, rel=1e-12)
    assert info["inner_product"] == pytest.approx(expected.inner_product_, rel=1e-12)
    assert info["sign"] == 1 and info["sign_margin"] > 0
    assert {"angle_degrees", "inner_product_squared", "w_hat_norm_sigma", "sign_statistic"} <= set(info)
    check_served_and_reloaded(client, name, 1, expected)


def test_fit_by_npz_upload_then_calibrate_and_reload(client, name, large):
    created = upload(client, name, npz_bytes(large))
    assert created.status_code == 201, created.text
    expected = local_fit(large)
    assert created.json()["summary"]["fit"]["angle"] == pytest.approx(expected.theta_, rel=1e-12)
    check_served_and_reloaded(client, name, 1, expected)

    # The same with an unlabeled pool instead of Sigma, as version 2.
    pool = simulation.toeplitz_rows(np.random.default_rng(3), 2400, 600)
    created = upload(client, name, npz_bytes(large, Sigma=None, X_unlabeled=pool))
    assert created.status_code == 201, created.text
    assert created.json()["version"] == 2
    info = created.json()["summary"]["fit"]
    assert info["sigma_from"] == "X_unlabeled"
    check_served_and_reloaded(client, name, 2, local_fit(large, Sigma=None, X_unlabeled=pool))


def _json_cases(sim):
    d = sim.X.shape[1]
    not_pd = sim.Sigma.copy()
    not_pd[4, 4] = -1.0
    asymmetric = sim.Sigma.copy()
    asymmetric[1, 3] += 0.5
    return [
        ("w_hat of zero", {}, {"w_hat": [0.0] * d}, "/holdout/w_hat", "zero"),
        ("w_hat of the wrong length", {}, {"w_hat": sim.w_hat[:-2].tolist()}, "/holdout/w_hat", "columns"),
        ("w_hat for another lambda", {"lambda": 2.0}, {}, "/holdout/w_hat", "lambda"),
        ("y of the wrong length", {}, {"y": sim.y[:-1].tolist()}, "/holdout/y", "rows"),
        ("Sigma not positive definite", {}, {"Sigma": not_pd.tolist()}, "/holdout/Sigma", "positive definite"),
        ("Sigma not symmetric", {}, {"Sigma": asymmetric.tolist()}, "/holdout/Sigma/1/3", "symmetric"),
        ("Sigma of the wrong shape", {}, {"Sigma": sim.Sigma[:5, :5].tolist()}, "/holdout/Sigma", "columns"),
        ("Sigma and X_unlabeled", {}, {"X_unlabeled": sim.X.tolist()}, "/holdout/Sigma", "not both"),
        ("neither Sigma nor X_unlabeled", {}, {"Sigma": None}, "/holdout/Sigma", "X_unlabeled"),
        ("d above the limit", {"max_dimension": 50}, {}, "/holdout/X", "limit of 50"),
        ("X missing", {}, {"X": None}, "/holdout/X", "required"),
        ("no lambda", {"lambda": None}, {}, "/options/lambda", "required"),
        ("unknown link", {"link": {"family": "cauchy"}}, {}, "/options/link/family", "probit"),
    ]


@pytest.mark.parametrize("case", range(13))
def test_bad_json_fit_gets_422_naming_the_field_and_writes_nothing(client, row_counts, small, case):
    label, option_changes, holdout_changes, pointer, fragment = _json_cases(small)[case]
    options = {key: value for key, value in (OPTIONS | option_changes).items() if value is not None}
    body = {"name": "bad-angular", "method": "angular", "input": "logit", "options": options,
            "holdout": json_holdout(small, **holdout_changes)}
    before = row_counts()
    response = client.post("/calibrators", json=body)
    assert response.status_code == 422, (label, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    errors = response.json()["errors"]
    assert errors[0]["pointer"] == pointer, (label, errors)
    assert fragment in errors[0]["detail"], (label, errors)
    assert row_counts() == before


def test_probability_input_is_refused(client, row_counts, small):
    body = {"name": "bad-angular", "method": "angular", "input": "probability", "options": OPTIONS,
            "holdout": json_holdout(small)}
    before = row_counts()
    response = client.post("/calibrators", json=body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/input"
    assert row_counts() == before


@pytest.mark.parametrize(
    "label,changes,options,pointer,fragment",
    [
        ("w_hat of zero", {"w_hat": np.zeros(60)}, OPTIONS, "/file/w_hat", "zero"),
        ("d above the limit", {}, OPTIONS | {"max_dimension": 59}, "/file/X", "limit of 59"),
        ("Sigma not positive definite", {"Sigma": -np.eye(60)}, OPTIONS, "/file/Sigma", "positive definite"),
        ("training labels missing", {"y": None}, OPTIONS, "/file/y", "required"),
        ("a holdout label of 2", {"y_holdout": np.r_[2, np.zeros(119, dtype=int)]}, OPTIONS, "/file", "0 or 1"),
    ],
)
def test_bad_npz_upload_gets_422_naming_the_array_and_writes_nothing(
    client, row_counts, small, label, changes, options, pointer, fragment
):
    before = row_counts()
    response = upload(client, "bad-angular", npz_bytes(small, **changes), options=options)
    assert response.status_code == 422, (label, response.text)
    error = response.json()["errors"][0]
    assert error["pointer"].startswith(pointer), (label, error)
    assert fragment in error["detail"], (label, error)
    assert row_counts() == before
