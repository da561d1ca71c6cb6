"""The multicalibration method: segments corrected, node arrays equal to LightGBM's trees, JSON round trip, API."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np
import pytest

from calibd.calibration import from_dict, get_method
from calibd.inputs import CalibrationInputError
from calibd.calibration.columns import check_columns
from calibd.calibration.multicalibration import MulticalibrationCalibrator, _flatten_trees, _Forest
from calibd.calibration.platt import PlattCalibrator
from calibd.metrics import log_loss
from calibd.metrics.multicalibration import multicalibration_error

COUNTRIES = np.array(["us", "br", "in", "de", "fr"])
DEVICES = np.array(["ios", "android", "web"])


def synthetic(n: int, seed: int):
    """The base model is off by +0.8 logits in one country, -0.7 in another, +0.5 on one device."""
    rng = np.random.default_rng(seed)
    c = rng.choice(5, n, p=[0.3, 0.25, 0.2, 0.15, 0.1])
    d = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    truth = rng.normal(-1.0, 1.5, n)
    score = truth + 0.8 * (c == 1) - 0.7 * (c == 2) + 0.5 * (d == 0)
    labels = (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(int)
    age = rng.uniform(18, 80, n)
    return 1 / (1 + np.exp(-score)), labels, {"country": COUNTRIES[c].tolist(), "device": DEVICES[d].tolist(), "age": age.tolist()}


def test_segments_are_corrected_where_a_global_calibrator_cannot():
    p, y, features = synthetic(40_000, 0)
    train, test = slice(0, 20_000), slice(20_000, None)
    fit_features = {k: v[train] for k, v in features.items()}
    test_features = {k: v[test] for k, v in features.items()}
    model = MulticalibrationCalibrator().fit(p[train], y[train], features=fit_features)
    platt = PlattCalibrator().fit(p[train], y[train])
    segments = {k: np.array(test_features[k], dtype=object) for k in ("country", "device")}
    ours = model.predict(p[test], features=test_features)
    before = multicalibration_error(p[test], y[test], None, segments, max_values=5)
    after = multicalibration_error(ours, y[test], None, segments, max_values=5)
    global_only = multicalibration_error(platt.predict(p[test]), y[test], None, segments, max_values=5)
    assert before["mce_sigma"] > 20 and global_only["mce_sigma"] > 10
    assert after["mce_sigma"] < 5  # no segment left with strong evidence of miscalibration
    assert log_loss(ours, y[test]) < log_loss(platt.predict(p[test]), y[test]) - 0.005
    info = model.fit_info()  # the correction came from the segment stage or the trees, not a global map
    assert info["rounds"] >= 1 or info["training"]["start"] == "segment stage"


def test_node_arrays_walk_to_lightgbm_predictions():
    rng = np.random.default_rng(1)
    n = 5000
    X = np.column_stack([rng.normal(size=n), rng.integers(0, 12, n), np.where(rng.random(n) < 0.2, 0.0, rng.normal(size=n)),
                         np.where(rng.random(n) < 0.1, np.nan, rng.normal(size=n))])
    y = (rng.random(n) < 1 / (1 + np.exp(-(X[:, 0] + (X[:, 1] % 3 == 0) - np.nan_to_num(X[:, 3]))))).astype(float)
    for zero_as_missing in (False, True):
        params = {"objective": "binary", "num_leaves": 12, "verbosity": -1, "num_threads": 1, "min_data_in_leaf": 20,
                  "max_cat_to_onehot": 4, "zero_as_missing": zero_as_missing, "min_data_per_group": 10}
        booster = lgb.train(params, lgb.Dataset(X, y, categorical_feature=[1]), num_boost_round=30)
        forest = _Forest(_flatten_trees(booster.dump_model()["tree_info"]))
        probe = X.copy()
        probe[:50, 1] = -1  # negative and unseen categories go right, as in LightGBM
        probe[50:100, 1] = 40
        probe[100:150, 1] = np.nan
        probe[150:200, 0] = np.nan
        np.testing.assert_allclose(forest.raw(probe), booster.predict(probe, raw_score=True), rtol=0, atol=1e-12)


def test_json_round_trip_gives_identical_outputs_and_unknown_categories_get_the_global_correction():
    p, y, features = synthetic(6000, 2)
    model = MulticalibrationCalibrator(input="probability").fit(p, y, features=features)
    stored = json.loads(json.dumps(model.to_dict()))
    assert "rounds" in stored["state"]["model_"]
    rebuilt = from_dict(stored)
    probe = {k: list(v[:500]) for k, v in features.items()}
    probe["country"][:20] = ["zz"] * 20  # never seen at fit time
    np.testing.assert_array_equal(rebuilt.predict(p[:500], features=probe), model.predict(p[:500], features=probe))
    global_only = model.predict(p[:500])  # no features: the global correction for every row
    a, b = model.model_["global"]["a"], model.model_["global"]["b"]
    z = np.log(p[:500] / (1 - p[:500]))
    np.testing.assert_allclose(global_only, 1 / (1 + np.exp(-(a * z + b))), rtol=1e-12)
    with_features = model.predict(p[:500], features=probe)
    np.testing.assert_array_equal(with_features[:20], global_only[:20])
    assert not np.allclose(with_features[20:], global_only[20:])


@pytest.mark.parametrize("features,field", [
    ({"country": ["us"] * 50, "device": ["ios"] * 50}, "features.age"),
    ({"country": ["us"] * 50, "device": ["ios"] * 50, "age": [30.0] * 50, "plan": ["a"] * 50}, "features.plan"),
    ({"country": ["us"] * 50, "device": [1.0] * 50, "age": [30.0] * 50}, "features.device"),
    ({"country": ["us"] * 49, "device": ["ios"] * 50, "age": [30.0] * 50}, "features.country"),
])
def test_features_must_match_the_fit(features, field):
    p, y, fit_features = synthetic(3000, 3)
    model = MulticalibrationCalibrator().fit(p, y, features=fit_features)
    with pytest.raises(CalibrationInputError) as error:
        model.predict(p[:50], features=features)
    assert error.value.field == field


def test_columns_validation_names_the_row():
    with pytest.raises(CalibrationInputError) as error:
        check_columns({"country": ["us", "br", 3]}, "features", 3)
    assert (error.value.field, error.value.index) == ("features.country", (2,))
    with pytest.raises(CalibrationInputError) as error:
        check_columns({"age": [1.0, "x", 3.0]}, "features", 3)
    assert (error.value.field, error.value.index) == ("features.age", (1,))
    columns = check_columns({"age": [1.0, None, 3]}, "features", 3)
    assert np.isnan(columns.columns["age"][1])


def test_fitted_and_served_through_the_api_with_features(client, name):
    p, y, features = synthetic(3000, 4)
    body = {"name": name, "method": "multicalibration",
            "holdout": {"scores": p.tolist(), "labels": y.tolist(), "features": features}}
    created = client.post("/calibrators", json=body)
    assert created.status_code == 201, created.text
    summary = created.json()["summary"]
    assert summary["after"]["log_loss"] < summary["before"]["log_loss"]
    probe = {k: v[:100] for k, v in features.items()}
    served = client.post("/calibrate", json={"calibrator": name, "scores": p[:100].tolist(), "features": probe})
    assert served.status_code == 200, served.text
    stored = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    np.testing.assert_array_equal(served.json()["probabilities"], from_dict(stored).predict(p[:100], features=probe))
    bad = {**probe, "country": probe["country"][:99]}
    response = client.post("/calibrate", json={"calibrator": name, "scores": p[:100].tolist(), "features": bad})
    assert response.status_code == 422
    assert [e["pointer"] for e in response.json()["errors"]] == ["/features/country"]
    bad_fit = {**body, "holdout": {**body["holdout"], "features": {**features, "device": [7] + features["device"][1:]}}}
    response = client.post("/calibrators", json={**bad_fit, "name": name + "-b"})
    assert response.status_code == 422
    assert [e["pointer"] for e in response.json()["errors"]] == ["/holdout/features/device/1"]


def test_auto_can_choose_it_on_scores_alone():
    p, y, _ = synthetic(4000, 5)
    auto = get_method("auto").from_options("probability", {"candidates": ["multicalibration", "platt"]})
    auto.fit(p, y)
    assert set(auto.cv_log_loss_) == {"multicalibration", "platt"}
    assert auto.predict(p[:10]).shape == (10,)


def test_segment_stage_is_the_penalised_maximum_likelihood():
    from scipy.optimize import minimize

    from calibd.calibration.multicalibration import _segment_offsets

    rng = np.random.default_rng(8)
    n = 3000
    z = rng.normal(size=n)
    codes = [rng.integers(0, 4, n), rng.integers(0, 3, n)]
    eta = 0.8 * z - 0.3 + np.array([0.5, -0.5, 0.0, 1.0])[codes[0]] + np.array([0.3, 0.0, -0.2])[codes[1]]
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(float)
    w = rng.uniform(0.5, 2.0, n)
    l2 = 5.0

    def objective(theta):
        e = theta[0] * z + theta[1] + theta[2:6][codes[0]] + theta[6:9][codes[1]]
        return np.dot(w, np.logaddexp(0, e) - y * e) + 0.5 * l2 * np.dot(theta[2:], theta[2:])

    reference = minimize(objective, np.zeros(9), method="BFGS", options={"gtol": 1e-9}).x
    a, b, betas = _segment_offsets(z, y, w, codes, [4, 3], l2, (1.0, 0.0))
    np.testing.assert_allclose(np.r_[a, b, betas[0], betas[1]], reference, atol=1e-5)


def shifted_segment(n: int, seed: int):
    """One segment of a categorical feature is off by +1 logit: no function of the score alone fixes it."""
    rng = np.random.default_rng(seed)
    segment = rng.choice(np.array(["a", "b", "c", "d"]), n)
    truth = rng.normal(-0.5, 1.5, n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-truth))).astype(int)
    score = truth + 1.0 * (segment == "b")
    return 1 / (1 + np.exp(-score)), labels, {"segment": segment.tolist()}


def test_auto_with_features_chooses_multicalibration_over_http(client, name):
    p, y, features = shifted_segment(8000, 6)
    fit, test = slice(0, 4000), slice(4000, None)
    holdout = {"scores": p[fit].tolist(), "labels": y[fit].tolist(), "features": {"segment": features["segment"][:4000]}}
    created = client.post("/calibrators", json={"name": name, "method": "auto", "holdout": holdout})
    assert created.status_code == 201, created.text
    chosen = created.json()["summary"]["fit"]
    assert "multicalibration" in chosen["cv_log_loss"]  # joins the default candidates when features are given
    probe = {"segment": features["segment"][4000:]}
    served = client.post("/calibrate", json={"calibrator": name, "scores": p[test].tolist(), "features": probe})
    assert served.status_code == 200, served.text
    stored = client.get(f"/calibrators/{name}/versions/1").json()["parameters"]
    np.testing.assert_array_equal(served.json()["probabilities"], from_dict(stored).predict(p[test], features=probe))
    # Held out: as good as multicalibration fitted alone, clearly better than a global calibrator.
    ours = log_loss(np.asarray(served.json()["probabilities"]), y[test])
    alone = MulticalibrationCalibrator().fit(p[fit], y[fit], features=holdout["features"])
    platt = PlattCalibrator().fit(p[fit], y[fit])
    assert ours <= log_loss(alone.predict(p[test], features=probe), y[test]) + 0.002
    assert ours < log_loss(platt.predict(p[test]), y[test]) - 0.005
    assert chosen["chosen"] == "multicalibration"


def test_auto_without_features_keeps_its_candidates_and_refuses_conflicting_arrays():
    p, y, features = shifted_segment(2000, 7)
    auto = get_method("auto")().fit(p, y)
    assert "multicalibration" not in auto.cv_log_loss_
    # Any chosen method takes the features it was fitted beside; the chosen one gets them if it declares them.
    listed = get_method("auto").from_options("probability", {"candidates": ["platt"]}).fit(p, y)
    assert listed.predict_arrays == {}
    chose_platt = get_method("auto").from_options("probability", {"candidates": ["platt", "multicalibration"]})
    chose_platt.fit(p, y, features=features)
    probe = {"segment": features["segment"][:50]}
    np.testing.assert_array_equal(
        chose_platt.predict(p[:50], features=probe), chose_platt.calibrator_.predict(p[:50], **(
            {"features": probe} if chose_platt.chosen_ == "multicalibration" else {}))
    )
    with pytest.raises(CalibrationInputError) as error:
        get_method("auto").from_options("probability", {"candidates": ["selective", "multicalibration"]})
    assert error.value.field == "options.candidates"


def test_a_calibrator_stored_with_the_old_validation_fraction_option_still_loads():
    """Stored before the nested early stopping, params held validation_fraction: it loads and predicts the same."""
    p, y, features = synthetic(3000, 5)
    model = MulticalibrationCalibrator().fit(p, y, features=features)
    stored = model.to_dict()
    stored["params"]["validation_fraction"] = 0.2
    loaded = MulticalibrationCalibrator.from_dict(stored)
    np.testing.assert_array_equal(loaded.predict(p, features=features), model.predict(p, features=features))
