"""bernstein through the API: rows of M classifier scores, on SQLite and PostgreSQL."""

from __future__ import annotations

import numpy as np

from calibd.calibration import from_dict


def holdout(n=500, m=2, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n)
    scores = 1 / (1 + np.exp(-(z[:, None] + rng.normal(scale=0.8, size=(n, m)))))
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-2 * z))).astype(int)
    return scores, labels


def fit(client, name, scores, labels, **extra):
    body = {"name": name, "method": "bernstein", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}, **extra}
    return client.post("/calibrators", json=body)


def test_fit_calibrate_and_reload_from_stored_parameters(client, name):
    scores, labels = holdout()
    created = fit(client, name, scores, labels)
    assert created.status_code == 201, created.text
    out = created.json()
    assert out["method"] == "bernstein" and out["n_classes"] == 2 and out["n_samples"] == 500
    summary = out["summary"]
    assert summary["fit"]["n_scores"] == 2 and summary["fit"]["degree"] >= 1
    assert summary["fit"]["degree_choice"] == "5-fold cross-validated Brier score"
    assert str(summary["fit"]["degree"]) in summary["fit"]["cv_brier"]
    assert summary["after"]["brier"] < summary["before"]["brier"]

    grid = np.stack(np.meshgrid(np.linspace(0, 1, 11), np.linspace(0, 1, 11), indexing="ij"), axis=-1).reshape(-1, 2)
    served = client.post("/calibrate", json={"calibrator": name, "scores": grid.tolist()})
    assert served.status_code == 200, served.text
    probabilities = np.array(served.json()["probabilities"])
    assert probabilities.shape == (121,)
    assert np.all((probabilities >= 0) & (probabilities <= 1))
    square = probabilities.reshape(11, 11)
    assert np.diff(square, axis=0).min() >= -1e-12 and np.diff(square, axis=1).min() >= -1e-12

    stored = client.get(f"/calibrators/{name}/versions/1").json()
    rebuilt = from_dict(stored["parameters"])
    np.testing.assert_array_equal(rebuilt.predict(grid), probabilities)
    assert rebuilt.fit_info() == stored["summary"]["fit"]


def test_three_scores_with_a_fixed_degree_and_logit_input(client, name):
    scores, labels = holdout(m=3, seed=1)
    logits = np.log(scores / (1 - scores))
    created = fit(client, name, logits, labels, input="logit", options={"degree": 4})
    assert created.status_code == 201, created.text
    assert created.json()["summary"]["fit"]["n_coefficients"] == 125
    served = client.post("/calibrate", json={"calibrator": name, "scores": logits[:20].tolist()})
    assert served.status_code == 200
    stored = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    np.testing.assert_array_equal(from_dict(stored).predict(logits[:20]), served.json()["probabilities"])


def test_wrong_number_of_columns_at_calibrate_is_422_at_scores_and_writes_nothing(client, name, row_counts):
    scores, labels = holdout()
    assert fit(client, name, scores, labels, options={"degree": 3}).status_code == 201
    before = row_counts()
    for wrong in ([[0.1, 0.2, 0.3]], [0.1, 0.2], [[0.1, 0.2], [0.3]]):
        response = client.post("/calibrate", json={"calibrator": name, "scores": wrong, "ids": ["a"] * len(wrong)})
        assert response.status_code == 422, response.text
        pointers = [e["pointer"] for e in response.json()["errors"]]
        assert pointers and all(p.startswith("/scores") for p in pointers), pointers
    assert row_counts() == before


def test_bad_fits_are_422_at_the_right_field_and_write_nothing(client, name, row_counts):
    before = row_counts()
    rng = np.random.default_rng(0)
    labels = np.r_[[0, 1] * 50]
    cases = [
        (rng.uniform(size=(100, 5)), labels, {}, "/holdout/scores/0"),
        (rng.uniform(size=(100, 3)), labels, {"degree": 10}, "/options/degree"),
        (rng.uniform(size=(100, 4)), labels, {"max_degree": 8}, "/options/max_degree"),
        (rng.uniform(size=(100, 2)), np.r_[[0, 2] * 50], {}, "/holdout/labels/1"),
        (rng.uniform(size=(100, 2)) + 1, labels, {}, "/holdout/scores/0/0"),
        (rng.uniform(size=(100, 2)), labels, {"ridge": -1}, "/options/ridge"),
    ]
    for scores, y, options, at in cases:
        response = fit(client, name, scores, y, options=options)
        assert response.status_code == 422, response.text
        assert at in [e["pointer"] for e in response.json()["errors"]], response.json()
    assert row_counts() == before
    assert client.get(f"/calibrators/{name}").status_code == 404
