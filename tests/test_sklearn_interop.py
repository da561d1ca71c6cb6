"""Calibrators follow scikit-learn's conventions: they clone, sit in a Pipeline, and match the service offline."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from app.calibration import METHODS, from_dict
from app.calibration.platt import PlattCalibrator


def test_every_method_clones_with_its_options():
    for name, cls in METHODS.items():
        original = cls()
        copy = clone(original)
        assert type(copy) is cls and copy.get_params() == original.get_params(), name


def test_a_calibrator_is_the_last_step_of_a_pipeline():
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_rest, y_train, y_rest = train_test_split(X, y, test_size=0.6, random_state=0, stratify=y)
    X_hold, X_test, y_hold, y_test = train_test_split(X_rest, y_rest, test_size=0.5, random_state=0, stratify=y_rest)
    model = make_pipeline(StandardScaler(), LogisticRegression(C=100, max_iter=5000)).fit(X_train, y_train)
    pipeline = make_pipeline(FunctionTransformer(model.decision_function), PlattCalibrator(input="logit"))
    pipeline.fit(X_hold, y_hold)
    proba = pipeline.predict_proba(X_test)
    assert proba.shape == (X_test.shape[0], 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    # The same as calibrating the scores by hand.
    by_hand = PlattCalibrator(input="logit").fit(model.decision_function(X_hold), y_hold)
    np.testing.assert_allclose(proba[:, 1], by_hand.predict(model.decision_function(X_test)))


def test_an_exported_calibrator_gives_the_service_outputs_offline(client, name):
    rng = np.random.default_rng(0)
    scores = rng.uniform(size=500)
    labels = (rng.uniform(size=500) < scores**2).astype(int)
    body = {"name": name, "method": "beta", "holdout": {"scores": scores.tolist(), "labels": labels.tolist()}}
    assert client.post("/calibrators", json=body).status_code == 201
    exported = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    offline = from_dict(exported)
    grid = np.linspace(0, 1, 101)
    served = client.post("/calibrate", json={"calibrator": name, "scores": grid.tolist()}).json()["probabilities"]
    np.testing.assert_array_equal(offline.predict(grid), served)
