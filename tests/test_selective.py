"""Selective recalibration (papers/004): gradients, section 6's synthetic case, coverage, storage, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError, fit_calibrator, from_dict, get_method
from calibd.calibration import _mlp
from calibd.calibration.scales import sigmoid
from calibd.calibration.platt import PlattCalibrator
from calibd.calibration.selective import (
    Baselines,
    RecalibrationData,
    SelectiveCalibrator,
    coverage_threshold,
    hoeffding_half_width,
    minimise_recalibration,
    recalibration_losses,
    selective_loss,
)
from calibd.calibration.temperature import TemperatureCalibrator
from calibd.metrics import ece

# Small and quick selector for the tests (the defaults are [64, 64] and 100 epochs).
FAST = {"hidden": [32, 32], "epochs": 60}


def section6(
    n: int,
    rng: np.random.Generator,
    inlier_share: float = 0.8,
    c: float = 0.5,
    alpha: float = 1.0,
    separation: float = 4.0,
    noise_features: int = 3,
    spread: float = 2.5,
):
    """Section 6's case, in its spirit: the classifier's logit z ~ N(0, spread^2); inliers' true posterior
    is sigmoid(c z), which one Platt map fits (slope c), and outliers' is sigmoid(-alpha c z), flipped.

    Outliers have the inliers' score distribution (so no rule on the score can find them) but sit
    ``separation`` away in the features: features = (z / 2, ``noise_features`` coordinates ~ N(centre, I)).
    Returns scores (probabilities), labels, features, the true posterior and the inlier flags.
    """
    inlier = rng.uniform(size=n) < inlier_share
    z = rng.normal(0.0, spread, n)
    centre = np.zeros(noise_features)
    centre[0] = separation
    x = rng.normal(size=(n, noise_features)) + np.where(inlier[:, None], 0.0, centre)
    features = np.column_stack([z / 2.0, x])
    truth = np.where(inlier, sigmoid(c * z), sigmoid(-alpha * c * z))
    labels = (rng.uniform(size=n) < truth).astype(int)
    return sigmoid(z), labels, features, truth, inlier


#: The case the defaults are held to (ALGORITHMS.md): inliers sigmoid(0.5 v), outliers sigmoid(-2 v)
#: (v the score's logit), 6 features, target coverage 0.7 under an inlier share of 0.8.
DEFAULTS_CASE = {"c": 0.5, "alpha": 4.0, "noise_features": 5}
DEFAULTS_BETA = 0.7


# -- gradients ---------------------------------------------------------------------------


def numeric_gradient(function, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    grad = np.empty_like(x)
    for index in np.ndindex(x.shape):
        original = x[index]
        x[index] = original + step
        plus = function()
        x[index] = original - step
        minus = function()
        x[index] = original
        grad[index] = (plus - minus) / (2 * step)
    return grad


def test_mlp_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    params = _mlp.init_mlp(3, [6, 5], rng, output_bias=0.3)
    for p in params:  # non-zero biases, so every term of the gradient is exercised
        p += rng.normal(0, 0.1, p.shape)
    x = rng.normal(size=(20, 3))
    d = rng.normal(size=20)

    def objective() -> float:
        return float(np.dot(d, _mlp.forward(params, x)[0]))

    s, activations = _mlp.forward(params, x)
    analytic = _mlp.backward(params, activations, d)
    for p, g in zip(params, analytic):
        np.testing.assert_allclose(g, numeric_gradient(objective, p), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("penalty", [0.0, 32.0])
def test_selective_loss_gradients_match_finite_differences(penalty):
    rng = np.random.default_rng(2)
    s = rng.normal(0, 2, 30)
    losses = rng.exponential(0.7, 30)
    weights = rng.uniform(0.2, 2.0, 30)
    value, d_s, d_losses = selective_loss(s, losses, weights, 0.7, penalty)
    np.testing.assert_allclose(d_s, numeric_gradient(lambda: selective_loss(s, losses, weights, 0.7, penalty)[0], s), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        d_losses, numeric_gradient(lambda: selective_loss(s, losses, weights, 0.7, penalty)[0], losses), rtol=1e-6, atol=1e-9
    )
    # The paper's eq. (6) normalisation: the g-weighted mean loss, plus lambda (beta - mean g)^2.
    g, omega = sigmoid(s), weights / weights.sum()
    expected = np.dot(omega * g, losses) / np.dot(omega, g) + penalty * (0.7 - np.dot(omega, g)) ** 2
    assert value == pytest.approx(expected, rel=1e-12)


def _multiclass_data(rng, n=40, k=4, input="logit"):
    z = rng.normal(0, 2, (n, k))
    labels = rng.integers(0, k, n)
    scores = z if input == "logit" else np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return scores, labels


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_recalibration_loss_gradients_match_finite_differences(task):
    rng = np.random.default_rng(3)
    if task == "binary":
        scores, labels = rng.uniform(0.01, 0.99, 50), rng.integers(0, 2, 50)
        params = np.array([0.8, -0.3])
    else:
        scores, labels = _multiclass_data(rng)
        params = np.array([np.log(1.7)])
    data = RecalibrationData(scores, labels, "probability" if task == "binary" else "logit")
    q = rng.uniform(0, 1, labels.shape[0])

    def objective() -> float:
        return float(np.dot(q, recalibration_losses(params, data)[0]))

    np.testing.assert_allclose(q @ recalibration_losses(params, data)[1], numeric_gradient(objective, params), rtol=1e-6, atol=1e-9)


def test_top_label_loss_is_the_recalibrators_own_prediction():
    """h inside the loss is exactly what Platt / temperature's own _predict serve."""
    rng = np.random.default_rng(4)
    scores, labels = _multiclass_data(rng, input="probability")
    data = RecalibrationData(scores, labels, "probability")
    inner = TemperatureCalibrator(input="probability")
    inner.temperature_ = 1.7
    top = inner._predict(scores).max(axis=1)
    correct = labels == scores.argmax(axis=1)
    expected = -np.where(correct, np.log(top), np.log1p(-top))
    np.testing.assert_allclose(recalibration_losses(np.array([np.log(1.7)]), data)[0], expected, rtol=1e-9)
    binary_scores, binary_labels = rng.uniform(0.01, 0.99, 30), rng.integers(0, 2, 30)
    platt = PlattCalibrator()
    platt.a_, platt.b_ = 0.7, 0.2
    p = platt._predict(binary_scores)
    losses = recalibration_losses(np.array([0.7, 0.2]), RecalibrationData(binary_scores, binary_labels, "probability"))[0]
    np.testing.assert_allclose(losses, -np.where(binary_labels == 1, np.log(p), np.log1p(-p)), rtol=1e-9)


def test_minimise_recalibration_with_unit_weights_is_platt():
    rng = np.random.default_rng(5)
    scores = rng.uniform(0.02, 0.98, 400)
    labels = (rng.uniform(size=400) < scores**1.5).astype(int)
    weights = rng.uniform(0.5, 1.5, 400)
    platt = PlattCalibrator().fit(scores, labels, weights)
    theta = minimise_recalibration(np.array([1.0, 0.0]), RecalibrationData(scores, labels, "probability"), weights)
    np.testing.assert_allclose(theta, [platt.a_, platt.b_], rtol=1e-6, atol=1e-8)


def test_adam_minimises_a_quadratic():
    target = [np.array([[1.0, -2.0]]), np.array([3.0])]
    params = [np.zeros((1, 2)), np.zeros(1)]
    optimizer = _mlp.Adam(params, learning_rate=0.05)
    for _ in range(2000):
        optimizer.step(params, [2 * (p - t) for p, t in zip(params, target)])
    for p, t in zip(params, target):
        np.testing.assert_allclose(p, t, atol=1e-3)


def test_threshold_and_interval():
    s = np.arange(100.0)
    assert coverage_threshold(s, 0.8) == 20.0 and np.mean(s >= 20.0) == 0.8
    assert np.mean(s >= coverage_threshold(s, 0.333)) >= 0.333
    assert hoeffding_half_width(250, 0.05) == pytest.approx(np.sqrt(np.log(40) / 500))


# -- section 6's synthetic case ------------------------------------------------------------

SEEDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def section6_fits():
    """One joint fit per seed at the true inlier share (0.8), and a large fresh test set."""
    fits = []
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        train = section6(4000, rng)
        test = section6(50_000, rng)
        calibrator = SelectiveCalibrator(beta=0.8, mode="joint", seed=seed, **FAST).fit(train[0], train[1], features=train[2])
        fits.append((seed, train, test, calibrator))
    return fits


def test_section6_selective_recalibration_fits_the_inliers(section6_fits):
    for seed, train, (scores, labels, features, truth, inlier), calibrator in section6_fits:
        p, extras = calibrator.predict_details(scores, features=features)
        accepted = extras["accepted"]
        selective_ece = ece(p[accepted], labels[accepted], target="binary")
        distance = np.abs(p[accepted] - truth[accepted]).mean()

        # Baselines, fitted on the same holdout, at the same coverage (printed, not asserted).
        baselines = Baselines(train[0], train[1], np.ones(train[1].shape[0]), "probability", train[2], seed=seed)
        recalibrated, confidence, typicality = baselines.predict(scores, features)
        flags = baselines.accepted(0.8, confidence, typicality)
        recal_distance_all = np.abs(recalibrated - truth).mean()
        recal_distance_accepted = np.abs(recalibrated[accepted] - truth[accepted]).mean()
        kept = flags["confidence_rejection"]
        print(
            f"\nseed {seed}: coverage {accepted.mean():.3f}, inliers among accepted {inlier[accepted].mean():.3f}; "
            f"ECE on accepted: selective {selective_ece:.4f}, recalibration alone {ece(recalibrated, labels):.4f} (all rows), "
            f"confidence rejection {ece(recalibrated[kept], labels[kept]):.4f} (inliers {inlier[kept].mean():.3f}); "
            f"mean |p - true posterior|: selective {distance:.4f}, recalibration alone {recal_distance_all:.4f} "
            f"(all rows) / {recal_distance_accepted:.4f} (selective's accepted rows), "
            f"confidence rejection {np.abs(recalibrated[kept] - truth[kept]).mean():.4f}"
        )
        assert selective_ece < 0.02, seed
        assert inlier[accepted].mean() >= 0.90, seed
        assert distance < 0.05, seed
        assert distance < 0.5 * recal_distance_all, seed
        assert distance < 0.5 * recal_distance_accepted, seed


def test_section6_coverage_on_fresh_data_is_within_the_reported_interval(section6_fits):
    for seed, _, (scores, _, features, _, _), calibrator in section6_fits:
        low, high = calibrator.coverage_["interval"]
        assert calibrator.coverage_["n_rows"] == 1000 and high - low == pytest.approx(2 * hoeffding_half_width(1000, 0.05))
        coverage = calibrator.predict_details(scores, features=features)[1]["accepted"].mean()
        assert low <= coverage <= high, (seed, coverage, low, high)
        assert abs(coverage - 0.8) < 0.03


def test_section6_sequential_keeps_the_mixtures_recalibrator():
    """Theorem 2's point: with h fixed at the fit on all rows, selection alone cannot fix the slope."""
    rng = np.random.default_rng(0)
    scores, labels, features, truth, inlier = section6(4000, rng)
    sequential = SelectiveCalibrator(beta=0.8, mode="sequential", **FAST).fit(scores, labels, features=features)
    platt = PlattCalibrator().fit(scores, labels)
    assert sequential.recalibrator_.a_ < 0.4  # the mixture's slope, well below the inliers' 0.5
    test = section6(20_000, rng)
    p, extras = sequential.predict_details(test[0], features=test[2])
    accepted = extras["accepted"]
    assert test[4][accepted].mean() > 0.9  # it still finds the outliers
    print(
        f"\nsequential: Platt slope {sequential.recalibrator_.a_:.3f} (all-rows Platt on its training part; "
        f"all rows {platt.a_:.3f}), mean |p - true| on accepted {np.abs(p[accepted] - test[3][accepted]).mean():.4f}"
    )


# -- the default options on the case they are held to (ALGORITHMS.md) ------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_default_options_calibrate_the_accepted_rows(seed):
    """Default options only: ECE on the accepted rows < 0.03, mean |p - p_true| there below half
    recalibration alone's, coverage within 0.05 of beta, on 50,000 fresh rows."""
    rng = np.random.default_rng(seed)
    scores, labels, features, _, _ = section6(4000, rng, **DEFAULTS_CASE)
    test_scores, test_labels, test_features, truth, inlier = section6(50_000, rng, **DEFAULTS_CASE)
    calibrator = SelectiveCalibrator(beta=DEFAULTS_BETA).fit(scores, labels, features=features)
    p, extras = calibrator.predict_details(test_scores, features=test_features)
    accepted = extras["accepted"]
    alone = PlattCalibrator().fit(scores, labels).predict(test_scores)
    selective_ece = ece(p[accepted], test_labels[accepted], target="binary")
    distance = np.abs(p[accepted] - truth[accepted]).mean()
    alone_distance = np.abs(alone - truth).mean()
    print(
        f"\nseed {seed}, mode {calibrator.mode}: ECE on accepted {selective_ece:.4f}; mean |p - p_true| on accepted "
        f"{distance:.4f}, recalibration alone {alone_distance:.4f} (all rows), "
        f"{np.abs(alone[accepted] - truth[accepted]).mean():.4f} (the same rows); coverage {accepted.mean():.3f}; "
        f"inliers among accepted {inlier[accepted].mean():.3f}; slope {calibrator.recalibrator_.a_:.3f}"
    )
    assert selective_ece < 0.03
    assert distance < 0.5 * alone_distance
    assert distance < 0.5 * np.abs(alone[accepted] - truth[accepted]).mean()
    assert abs(accepted.mean() - DEFAULTS_BETA) <= 0.05


@pytest.fixture(scope="module")
def sequential_case():
    rng = np.random.default_rng(3)
    scores, labels, features, _, _ = section6(3000, rng, **DEFAULTS_CASE)
    return scores, labels, features


def test_guard_serves_recalibration_alone_when_the_selective_fit_is_far_worse(sequential_case):
    """``sequential`` keeps the mixture's recalibrator: far worse than recalibration alone, so not shipped."""
    scores, labels, features = sequential_case
    options = {"beta": DEFAULTS_BETA, "mode": "sequential", **FAST}
    result = fit_calibrator("selective", "probability", options, scores, labels, arrays={"features": features})
    guard = result.summary["selective"]["guard"]
    selective, alone = result.summary["selective"]["selective_recalibration"], result.summary["selective"]["recalibration_alone"]
    print(f"\nguard: {guard}")
    assert guard["far_worse"] and guard["fell_back"]
    assert guard["ece_accepted"] == selective["ece"] > 2 * alone["ece"]
    assert result.summary["fit"]["guard"] == guard
    # What is served is recalibration alone: Platt on every row, every input accepted.
    calibrator = result.calibrator
    platt = PlattCalibrator().fit(scores, labels)
    p, extras = calibrator.predict_details(scores[:200], features=features[:200])
    np.testing.assert_allclose(p, platt.predict(scores[:200]), rtol=0, atol=1e-12)
    assert extras["accepted"].all()
    # The summary's "after" describes it: recalibration alone's cross-fitted figures.
    assert result.summary["after"]["ece"] == pytest.approx(alone["ece"], rel=1e-12)
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    assert rebuilt.fit_info()["guard"] == guard
    np.testing.assert_array_equal(rebuilt.predict_details(scores[:200], features=features[:200])[0], p)


def test_guard_off_keeps_the_selective_fit_and_says_so(sequential_case):
    scores, labels, features = sequential_case
    options = {"beta": DEFAULTS_BETA, "mode": "sequential", "guard": False, **FAST}
    result = fit_calibrator("selective", "probability", options, scores, labels, arrays={"features": features})
    guard = result.summary["selective"]["guard"]
    assert guard["far_worse"] and not guard["fell_back"] and "kept" in guard["action"]
    assert result.calibrator.selector_ is not None
    accepted = result.calibrator.predict_details(scores, features=features)[1]["accepted"]
    assert abs(accepted.mean() - DEFAULTS_BETA) < 0.05


def test_guard_verdict_needs_a_gap_beyond_sampling_noise():
    from calibd.calibration.selective import guard_verdict

    noise = 0.5 * np.sqrt(15 / 400)
    small_sample = guard_verdict({"ece": 0.05, "n_accepted": 400}, {"ece": 0.02})
    assert small_sample["noise"] == pytest.approx(noise) and not small_sample["far_worse"]
    assert guard_verdict({"ece": 0.02 + noise + 0.01, "n_accepted": 400}, {"ece": 0.02})["fell_back"]
    assert not guard_verdict({"ece": 0.30, "n_accepted": 400}, {"ece": 0.20})["far_worse"]  # not twice as bad
    assert not guard_verdict({"ece": 0.30, "n_accepted": 400}, {"ece": 0.01}, enabled=False)["fell_back"]


# -- reproducibility, storage ----------------------------------------------------------------


def test_same_seed_same_parameters_and_reload_gives_identical_outputs():
    rng = np.random.default_rng(7)
    scores, labels, features, _, _ = section6(800, rng)
    options = {"beta": 0.7, "mode": "joint", "hidden": [16, 8], "epochs": 20, "seed": 11}
    first = SelectiveCalibrator(**options).fit(scores, labels, features=features)
    second = SelectiveCalibrator(**options).fit(scores, labels, features=features)
    assert json.dumps(first.to_dict()) == json.dumps(second.to_dict())
    other = SelectiveCalibrator(**{**options, "seed": 12}).fit(scores, labels, features=features)
    assert json.dumps(first.to_dict()) != json.dumps(other.to_dict())

    stored = json.loads(json.dumps(first.to_dict()))
    assert stored["state"]["selector"]["layers"][0][0][0] == first.selector_["layers"][0][0, 0]
    rebuilt = from_dict(stored)
    new_scores, _, new_features, _, _ = section6(500, rng)
    for a, b in zip(first.predict_details(new_scores, features=new_features), rebuilt.predict_details(new_scores, features=new_features)):
        if isinstance(a, dict):
            np.testing.assert_array_equal(a["accepted"], b["accepted"])
        else:
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first.selector_output(new_scores, new_features), rebuilt.selector_output(new_scores, new_features))


@pytest.mark.parametrize("case", ["multiclass", "scores_only", "beta_one", "multiclass_scores_only"])
def test_other_modes_round_trip_and_accept_about_beta(case):
    rng = np.random.default_rng(8)
    n = 1200
    beta = 1.0 if case == "beta_one" else 0.75
    if case.startswith("multiclass"):
        scores, labels = _multiclass_data(rng, n=n, k=5, input="probability")
        input = "probability"
    else:
        scores, labels, features, _, _ = section6(n, rng)
        input = "probability"
    arrays = {} if "scores_only" in case else {"features": rng.normal(size=(n, 4)) if case.startswith("multiclass") else features}
    calibrator = SelectiveCalibrator(input=input, beta=beta, mode="joint", hidden=[16], epochs=20).fit(scores, labels, **arrays)
    rebuilt = from_dict(json.loads(json.dumps(calibrator.to_dict())))
    p, extras = calibrator.predict_details(scores, **arrays)
    q, rebuilt_extras = rebuilt.predict_details(scores, **arrays)
    np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(extras["accepted"], rebuilt_extras["accepted"])
    assert extras["accepted"].dtype == bool
    if case.startswith("multiclass"):
        assert p.shape == scores.shape
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
    else:
        assert p.shape == scores.shape
    if beta == 1.0:
        assert extras["accepted"].all() and calibrator.coverage_["interval"] == [1.0, 1.0]
    else:
        assert abs(extras["accepted"].mean() - beta) < 0.1


def test_scores_only_mode_rejects_the_score_range_that_h_cannot_fit():
    """Without features the selector sees only the score, so it can reject a score range, no more."""
    rng = np.random.default_rng(9)
    n = 4000
    z = rng.normal(0, 2.0, n)
    # Platt fits the scores below z = 2; above it the true posterior falls back to 0.2.
    truth = np.where(z < 2.0, sigmoid(0.7 * z), 0.2)
    labels = (rng.uniform(size=n) < truth).astype(int)
    share_above = np.mean(z >= 2.0)
    calibrator = SelectiveCalibrator(beta=float(1 - share_above), mode="joint", **FAST).fit(sigmoid(z), labels)
    grid = np.linspace(-5, 5, 201)
    accepted = calibrator.predict_details(sigmoid(grid))[1]["accepted"]
    assert accepted[grid < 1.0].mean() > 0.9
    assert accepted[grid > 3.0].mean() < 0.1
    assert calibrator.fit_info()["selector_input"] == "scores"


# -- the fit summary -----------------------------------------------------------------------------


def test_fit_summary_reports_cross_fitted_selective_metrics_and_baselines():
    rng = np.random.default_rng(10)
    scores, labels, features, _, _ = section6(1500, rng)
    result = fit_calibrator(
        "selective", "probability", {"beta": 0.8, "mode": "joint", **FAST}, scores, labels, arrays={"features": features}
    )
    summary = result.summary
    coverage = summary["fit"]["coverage"]
    assert coverage["target"] == 0.8 and coverage["n_rows"] == 375
    assert coverage["interval"][0] < coverage["reached"] < coverage["interval"][1]
    selective = summary["selective"]
    for name in ("selective_recalibration", "recalibration_alone", "confidence_rejection", "isolation_forest"):
        for key in ("coverage", "ece", "brier", "accuracy_accepted", "accuracy_all"):
            assert isinstance(selective[name][key], float), (name, key)
    assert selective["recalibration_alone"]["coverage"] == 1.0
    for name in ("selective_recalibration", "confidence_rejection", "isolation_forest"):
        assert abs(selective[name]["coverage"] - 0.8) < 0.06
    assert selective["isolation_forest"]["on"] == "features"
    print("\n" + json.dumps(selective, indent=1))
    json.dumps(summary)  # plain JSON types
    assert not hasattr(result.calibrator, "_holdout")


# -- bad input -----------------------------------------------------------------------------------


def _fitted(features: bool = True) -> tuple[SelectiveCalibrator, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    scores, labels, x, _, _ = section6(300, rng)
    calibrator = SelectiveCalibrator(hidden=[8], epochs=5)
    calibrator.fit(scores, labels, **({"features": x} if features else {}))
    return calibrator, scores, x


def test_missing_or_wrong_features_at_predict_are_input_errors():
    calibrator, scores, x = _fitted()
    assert calibrator.predict_arrays["features"].required
    with pytest.raises(CalibrationInputError) as missing:
        calibrator.predict(scores)
    assert missing.value.field == "features"
    with pytest.raises(CalibrationInputError) as width:
        calibrator.predict(scores, features=x[:, :3])
    assert width.value.field == "features" and "4" in width.value.detail
    with pytest.raises(CalibrationInputError) as rows:
        calibrator.predict(scores, features=x[:10])
    assert rows.value.field == "features"
    with pytest.raises(CalibrationInputError) as finite:
        bad = x.copy()
        bad[2, 1] = np.nan
        calibrator.predict(scores, features=bad)
    assert finite.value.field == "features" and finite.value.index == (2, 1)


def test_scores_only_calibrator_refuses_features_and_prototype_declares_them_optional():
    assert not SelectiveCalibrator().predict_arrays["features"].required
    calibrator, scores, x = _fitted(features=False)
    assert not calibrator.predict_arrays["features"].required
    calibrator.predict(scores)
    with pytest.raises(CalibrationInputError) as error:
        calibrator.predict(scores, features=x)
    assert error.value.field == "features"


@pytest.mark.parametrize(
    "options, field",
    [
        ({"beta": 0.0}, "options.beta"),
        ({"beta": 1.2}, "options.beta"),
        ({"beta": -0.5}, "options.beta"),
        ({"beta": "0.5"}, "options.beta"),
        ({"beta": float("nan")}, "options.beta"),
        ({"mode": "both"}, "options.mode"),
        ({"hidden": [0]}, "options.hidden"),
        ({"hidden": 64}, "options.hidden"),
        ({"epochs": 0}, "options.epochs"),
        ({"learning_rate": 0}, "options.learning_rate"),
        ({"coverage_penalty": -1}, "options.coverage_penalty"),
        ({"threshold_fraction": 0.0}, "options.threshold_fraction"),
        ({"threshold_fraction": 1.0}, "options.threshold_fraction"),
        ({"confidence": 1.0}, "options.confidence"),
        ({"seed": -1}, "options.seed"),
        ({"depth": 3}, "options.depth"),
    ],
)
def test_bad_options_are_input_errors(options, field):
    with pytest.raises(CalibrationInputError) as error:
        get_method("selective").from_options("probability", options)
    assert error.value.field == field
    if field != "options.depth":
        rng = np.random.default_rng(0)
        with pytest.raises(CalibrationInputError) as fit_error:
            SelectiveCalibrator(**options).fit(rng.uniform(size=40), np.arange(40) % 2)
        assert fit_error.value.field == field


def test_bad_features_at_fit_are_input_errors():
    rng = np.random.default_rng(12)
    scores, labels = rng.uniform(size=50), np.arange(50) % 2
    with pytest.raises(CalibrationInputError) as rows:
        SelectiveCalibrator().fit(scores, labels, features=rng.normal(size=(49, 3)))
    assert rows.value.field == "features"
    with pytest.raises(CalibrationInputError) as flat:
        SelectiveCalibrator().fit(scores, labels, features=rng.normal(size=50))
    assert flat.value.field == "features"
    with pytest.raises(CalibrationInputError) as shape:
        calibrator = SelectiveCalibrator(hidden=[4], epochs=2).fit(scores, labels)
        calibrator.predict(np.column_stack([scores, 1 - scores]))
    assert shape.value.field == "scores"
