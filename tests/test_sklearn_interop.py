"""Calibrators follow scikit-learn's conventions: they clone, sit in a Pipeline, and match the service offline."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss, log_loss, make_scorer
from sklearn.model_selection import StratifiedKFold, cross_val_score, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from calibd.calibration import METHODS, from_dict, get_method
from calibd.calibration.platt import PlattCalibrator


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


def test_pipeline_post_processing_clones_sets_pandas_output_and_cross_validates_with_a_proper_scorer():
    """CalibratedClassifierCV-style: a fitted model's scores, then a calibrator, scored by Brier and log-loss."""
    pd = pytest.importorskip("pandas")  # the test extra installs it (with pyspark)
    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_hold, y_train, y_hold = train_test_split(X, y, test_size=0.5, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), LogisticRegression(C=100, max_iter=5000)).fit(X_train, y_train)
    scores = FunctionTransformer(lambda X: model.decision_function(X)[:, None], feature_names_out=lambda *_: ["score"])
    pipeline = make_pipeline(scores, PlattCalibrator(input="logit")).set_output(transform="pandas")
    copy = clone(pipeline)
    assert copy is not pipeline and copy.get_params()["plattcalibrator__input"] == "logit"

    # set_output: the calibrator is handed a DataFrame of one named column, and remembers its name.
    fitted = clone(pipeline).fit(X_hold, y_hold)
    assert isinstance(fitted[0].transform(X_hold[:3]), pd.DataFrame)
    assert list(fitted[-1].feature_names_in_) == ["score"] and fitted[-1].n_features_in_ == 1

    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    brier = cross_val_score(pipeline, X_hold, y_hold, cv=folds, scoring=make_scorer(brier_score_loss, greater_is_better=False))
    logloss = cross_val_score(
        pipeline, X_hold, y_hold, cv=folds, scoring=make_scorer(log_loss, greater_is_better=False, labels=[0, 1])
    )
    # The same folds by hand, with the scores and the proper scoring rules computed in numpy.
    z = model.decision_function(X_hold)
    for k, (train, test) in enumerate(folds.split(X_hold, y_hold)):
        p = PlattCalibrator(input="logit").fit(z[train], y_hold[train]).predict(z[test])
        assert -brier[k] == pytest.approx(np.mean((p - y_hold[test]) ** 2), rel=1e-12)
        expected = -np.mean(y_hold[test] * np.log(p) + (1 - y_hold[test]) * np.log1p(-p))
        assert -logloss[k] == pytest.approx(expected, rel=1e-9)


def test_multiclass_calibrator_after_a_model_in_a_pipeline():
    X, y = load_iris(return_X_y=True)
    X_train, X_hold, y_train, y_hold = train_test_split(X, y, test_size=0.5, random_state=0, stratify=y)
    model = LogisticRegression(max_iter=2000).fit(X_train, y_train)
    pipeline = make_pipeline(FunctionTransformer(model.decision_function), get_method("dirichlet")(input="logit"))
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
    scores = cross_val_score(pipeline, X_hold, y_hold, cv=folds, scoring=make_scorer(log_loss, greater_is_better=False, labels=[0, 1, 2]))
    assert np.all(np.isfinite(scores)) and np.all(scores < 0)
    proba = clone(pipeline).fit(X_hold, y_hold).predict_proba(X_hold)
    assert proba.shape == (X_hold.shape[0], 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
