"""Beta calibration against direct logistic fits, betacal's outputs, and properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression

from calibd.inputs import CalibrationInputError
from calibd.calibration.beta import BetaCalibrator, beta_midpoint, log_probabilities

GRID = np.array([0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999])

# Output of benchmarks/reference/betacal_reference.py (betacal's BetaCalibration,
# unit weights), predictions on GRID. betacal fits with scikit-learn's lbfgs at
# its default tolerance, so it agrees with the exact optimum to about 1e-4.
BETACAL_REFERENCE = {'versions': {'betacal': '1.1.0', 'scikit-learn': '1.9.1', 'numpy': '2.4.6'},
 'abm': {'variant': 'abm',
         'data': [400, 1.6, 0.7, 0.4],
         'a': 1.3281645568023221,
         'b': 1.0631743737516914,
         'm': 0.5621565603586078,
         'predictions': [9.264377022361323e-05, 0.0019876299211120437, 0.017337807527918955, 0.04481853800868834,
                         0.11779880002268743, 0.20867173293006314, 0.31281913653430043, 0.42634938214427576,
                         0.5455315533782136, 0.6666841455084459, 0.786113824193254, 0.8998022410729596,
                         0.9527444078628293, 0.9915881485646146, 0.9992758122215979]},
 'ab': {'variant': 'ab',
        'data': [400, 1.6, 0.7, 0.4],
        'a': 1.734305988866233,
        'b': 0.6811863056161377,
        'm': 0.5,
        'predictions': [1.301346591305272e-05, 0.0007096979557849135, 0.011767119801301266, 0.039481158623534,
                        0.1290608021102939, 0.24691606678848857, 0.3749136317853769, 0.5, 0.614958508055531,
                        0.7173821871007537, 0.80834542458691, 0.8924225808080232, 0.9359357575971082,
                        0.9791537672488594, 0.9956520789378432]},
 'am': {'variant': 'am',
        'data': [400, 1.6, 0.7, 0.4],
        'a': 1.1849296487200884,
        'b': 1.1849296487200884,
        'm': 0.5686759799480482,
        'predictions': [0.00020108258447966746, 0.0031024094374427938, 0.02153030590375456, 0.050635889655168194,
                        0.12236348235515786, 0.2089008440920152, 0.3083119683844219, 0.418830718936673,
                        0.5381438384948036, 0.6629376703001895, 0.7883629899582196, 0.9068681886530963,
                        0.9593547051746243, 0.9940436219247804, 0.9996129011370342]},
 'abm_drop_a': {'variant': 'abm',
                'data': [400, -0.6, 1.5, -0.5],
                'a': 0.0,
                'b': 0.7149428818673905,
                'm': 5.9608609865491405e-06,
                'predictions': [0.6767256850774394, 0.6781395179518357, 0.6845413065155106, 0.6928284880213512,
                                0.7104528343846043, 0.7296902638551578, 0.7508705464538813, 0.7744498026122748,
                                0.8010938498353982, 0.8318535740414875, 0.8686078783067972, 0.9156196338396695,
                                0.9468401529035734, 0.9825443672085908, 0.9965868474738864]},
 'abm_drop_b': {'variant': 'abm',
                'data': [400, 1.5, -0.6, 0.5],
                'a': 0.7982131263885704,
                'b': 0.0,
                'm': 0.9999940391390134,
                'predictions': [0.0021326546104957367, 0.013251568510081345, 0.04628156654961144,
                                0.07781974230585781, 0.12796571352594083, 0.16862287417899574, 0.2033013405028148,
                                0.2336757185977333, 0.2607373623017365, 0.28514242559981845, 0.30735630919032403,
                                0.3277251288005317, 0.33730330073017867, 0.3447010058086579, 0.346334536099494]}}


def reference_data(n: int, a: float, b: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """The data of benchmarks/reference/betacal_reference.py (no random generator)."""
    i = np.arange(1, n + 1, dtype=np.float64)
    p = 0.0005 + 0.999 * np.mod(i * 2.0**0.5, 1.0)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log1p(-p) + c)))
    labels = (np.mod(i * (1.0 + 5.0**0.5) / 2.0, 1.0) < truth).astype(np.int64)
    return p, labels


def beta_data(seed: int, n: int, a: float, b: float, c: float, weighted: bool = False):
    rng = np.random.default_rng(seed)
    p = rng.beta(2.0, 3.0, n)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log1p(-p) + c)))
    labels = (rng.random(n) < truth).astype(np.int64)
    weights = rng.uniform(0.2, 3.0, n) if weighted else None
    return p, labels, weights


def sklearn_fit(features: np.ndarray, labels, weights, fit_intercept: bool = True) -> LogisticRegression:
    """An (effectively) unpenalised logistic regression solved to tight tolerance."""
    model = LogisticRegression(C=1e12, solver="newton-cholesky", tol=1e-12, max_iter=1000, fit_intercept=fit_intercept)
    return model.fit(features, labels, sample_weight=weights)


def features(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    log_p, log_1mp = log_probabilities(p, "probability")
    return log_p, -log_1mp


# -- against a direct logistic regression --------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
def test_abm_matches_logistic_regression_on_log_features(weighted):
    p, y, w = beta_data(1, 5000, a=1.6, b=0.7, c=0.4, weighted=weighted)
    x1, x2 = features(p)
    reference = sklearn_fit(np.column_stack([x1, x2]), y, w)
    assert (reference.coef_[0] > 0).all()  # the constraint is inactive
    calibrator = BetaCalibrator().fit(p, y, w)
    g1, g2 = features(GRID)
    expected = reference.predict_proba(np.column_stack([g1, g2]))[:, 1]
    np.testing.assert_allclose(calibrator.predict(GRID), expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(calibrator.predict(p), reference.predict_proba(np.column_stack([x1, x2]))[:, 1], atol=1e-6)
    info = calibrator.fit_info()
    np.testing.assert_allclose([info["a"], info["b"], info["c"]], [*reference.coef_[0], reference.intercept_[0]], atol=1e-6)


def test_abm_drops_ln_p_when_its_coefficient_is_negative():
    # The label model has a < 0: the unconstrained fit does too.
    p, y, _ = beta_data(2, 5000, a=-0.8, b=1.5, c=-0.5)
    x1, x2 = features(p)
    unconstrained = sklearn_fit(np.column_stack([x1, x2]), y, None)
    assert unconstrained.coef_[0][0] < 0 < unconstrained.coef_[0][1]
    calibrator = BetaCalibrator().fit(p, y)
    assert calibrator.a_ == 0.0 and calibrator.b_ > 0
    reference = sklearn_fit(x2[:, None], y, None)
    g1, g2 = features(GRID)
    np.testing.assert_allclose(calibrator.predict(GRID), reference.predict_proba(g2[:, None])[:, 1], atol=1e-6)
    np.testing.assert_allclose([calibrator.b_, calibrator.c_], [reference.coef_[0][0], reference.intercept_[0]], atol=1e-6)


def test_abm_drops_minus_ln_1mp_when_its_coefficient_is_negative():
    p, y, _ = beta_data(3, 5000, a=1.5, b=-0.8, c=0.5)
    x1, x2 = features(p)
    unconstrained = sklearn_fit(np.column_stack([x1, x2]), y, None)
    assert unconstrained.coef_[0][1] < 0 < unconstrained.coef_[0][0]
    calibrator = BetaCalibrator().fit(p, y)
    assert calibrator.b_ == 0.0 and calibrator.a_ > 0
    reference = sklearn_fit(x1[:, None], y, None)
    g1, _ = features(GRID)
    np.testing.assert_allclose(calibrator.predict(GRID), reference.predict_proba(g1[:, None])[:, 1], atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_ab_is_a_logistic_regression_without_intercept_on_log_2p(weighted):
    p, y, w = beta_data(4, 5000, a=1.6, b=0.7, c=0.4, weighted=weighted)
    x = np.log(2.0 * np.column_stack([p, 1.0 - p]))
    reference = sklearn_fit(x, y, w, fit_intercept=False)
    calibrator = BetaCalibrator(variant="ab").fit(p, y, w)
    g = np.log(2.0 * np.column_stack([GRID, 1.0 - GRID]))
    np.testing.assert_allclose(calibrator.predict(GRID), reference.predict_proba(g)[:, 1], atol=1e-6)
    np.testing.assert_allclose([calibrator.a_, -calibrator.b_], reference.coef_[0], atol=1e-6)
    assert calibrator.predict(np.array([0.5]))[0] == pytest.approx(0.5, abs=1e-12)
    assert calibrator.fit_info()["m"] == 0.5


@pytest.mark.parametrize("weighted", [False, True])
def test_am_is_platt_scaling_on_the_logit(weighted):
    p, y, w = beta_data(5, 5000, a=1.6, b=0.7, c=0.4, weighted=weighted)
    logit = np.log(p / (1.0 - p))
    reference = sklearn_fit(logit[:, None], y, w)
    calibrator = BetaCalibrator(variant="am").fit(p, y, w)
    g = np.log(GRID / (1.0 - GRID))
    np.testing.assert_allclose(calibrator.predict(GRID), reference.predict_proba(g[:, None])[:, 1], atol=1e-6)
    info = calibrator.fit_info()
    assert info["a"] == info["b"]
    assert info["m"] == pytest.approx(1.0 / (1.0 + np.exp(info["c"] / info["a"])), abs=1e-12)


@pytest.mark.parametrize("variant", ["abm", "ab", "am"])
def test_backwards_scores_give_a_non_decreasing_fit(variant):
    # Labels that fall as the score rises: betacal would return a negative
    # coefficient for ab and am; here a, b >= 0 always.
    p, y, _ = beta_data(6, 3000, a=-1.5, b=-1.5, c=0.0)
    calibrator = BetaCalibrator(variant=variant).fit(p, y)
    assert calibrator.a_ >= 0 and calibrator.b_ >= 0
    assert (np.diff(calibrator.predict(GRID)) >= 0).all()
    if variant != "ab":  # nothing left: the weighted base rate
        np.testing.assert_allclose(calibrator.predict(GRID), y.mean(), atol=1e-12)


# -- against betacal ----------------------------------------------------------------


@pytest.mark.parametrize("name", [k for k in BETACAL_REFERENCE if k != "versions"])
def test_matches_betacal(name):
    ref = BETACAL_REFERENCE[name]
    scores, labels = reference_data(*ref["data"])
    calibrator = BetaCalibrator(variant=ref["variant"]).fit(scores, labels)
    np.testing.assert_allclose(calibrator.predict(GRID), ref["predictions"], rtol=0, atol=5e-4)
    assert calibrator.a_ == pytest.approx(ref["a"], abs=5e-3)
    assert calibrator.b_ == pytest.approx(ref["b"], abs=5e-3)
    assert (calibrator.a_ == 0) == (ref["a"] == 0) and (calibrator.b_ == 0) == (ref["b"] == 0)
    m = calibrator.fit_info()["m"]
    if name.startswith("abm_drop"):
        # The fitted map never crosses 1/2 on (0, 1): betacal's bounded search
        # returns an end of the interval, here there is no m.
        assert m is None and min(ref["m"], 1 - ref["m"]) < 1e-4
    else:
        assert m == pytest.approx(ref["m"], abs=1e-3)


# -- details --------------------------------------------------------------------------


def test_logit_input_gives_the_same_fit():
    p, y, _ = beta_data(7, 2000, a=1.6, b=0.7, c=0.4)
    z = np.log(p) - np.log1p(-p)
    on_p = BetaCalibrator().fit(p, y)
    on_z = BetaCalibrator(input="logit").fit(z, y)
    np.testing.assert_allclose(on_z.predict(np.log(GRID / (1 - GRID))), on_p.predict(GRID), atol=1e-9)


def test_log_probabilities_are_stable_for_extreme_logits():
    log_p, log_1mp = log_probabilities(np.array([-25.0, 0.0, 25.0]), "logit")
    np.testing.assert_allclose(log_p, [-25.0 - np.log1p(np.exp(-25.0)), np.log(0.5), -np.log1p(np.exp(-25.0))], rtol=1e-14)
    np.testing.assert_allclose(log_1mp, log_p[::-1], rtol=1e-14)
    # Clipped to [1e-12, 1 - 1e-12] like probabilities.
    lo, hi = log_probabilities(np.array([-1000.0, 1000.0]), "logit")
    np.testing.assert_allclose(lo[0], np.log(1e-12), rtol=1e-9)
    np.testing.assert_allclose(hi[1], np.log(1e-12), rtol=1e-9)
    lo, hi = log_probabilities(np.array([0.0, 1.0]), "probability")
    assert np.isfinite(lo).all() and np.isfinite(hi).all()


def test_midpoint():
    a, b, m = 1.3, 0.6, 0.3
    c = b * np.log(1 - m) - a * np.log(m)
    assert beta_midpoint(a, b, c) == pytest.approx(m, abs=1e-12)
    assert beta_midpoint(2.0, 0.0, -2.0 * np.log(0.2)) == pytest.approx(0.2, abs=1e-14)
    assert beta_midpoint(0.0, 2.0, 2.0 * np.log(1 - 0.7)) == pytest.approx(0.7, abs=1e-14)
    assert beta_midpoint(2.0, 0.0, -1.0) is None  # sigmoid(2 ln p - 1) < 1/2 on all of (0, 1)
    assert beta_midpoint(0.0, 2.0, 1.0) is None  # sigmoid(-2 ln(1 - p) + 1) > 1/2 on all of (0, 1)
    assert beta_midpoint(0.0, 0.0, 0.3) is None


def test_predict_before_fit_and_bad_options():
    from calibd.calibration.base import NotFittedError

    with pytest.raises(NotFittedError):
        BetaCalibrator().predict([0.5])
    for options, field in [
        ({"variant": "abc"}, "options.variant"),
        ({"variant": 3}, "options.variant"),
        ({"parameters": "abm"}, "options.parameters"),
    ]:
        with pytest.raises(CalibrationInputError) as excinfo:
            BetaCalibrator.from_options("probability", options)
        assert excinfo.value.field == field
    with pytest.raises(CalibrationInputError):
        BetaCalibrator(variant="x").fit(np.linspace(0.1, 0.9, 10), [0, 1] * 5)


# -- properties -------------------------------------------------------------------------


@st.composite
def holdouts(draw):
    n = draw(st.integers(10, 60))
    scores = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    labels = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    labels[:4] = [0, 0, 1, 1]
    return np.array(scores), np.array(labels)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holdouts(), st.sampled_from(["abm", "ab", "am"]), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_properties(holdout, variant, queries):
    scores, labels = holdout
    calibrator = BetaCalibrator(variant=variant).fit(scores, labels)
    queries = np.sort(np.concatenate([queries, GRID, [0.0, 1.0]]))
    out = calibrator.predict(queries)
    assert ((out >= 0) & (out <= 1)).all()
    assert calibrator.a_ >= 0 and calibrator.b_ >= 0
    # Monotone because a, b >= 0 (allowing an ulp of rounding in exp/log).
    assert (np.diff(out) >= -1e-15).all()
    data = json.loads(json.dumps(calibrator.to_dict()))
    assert data["method"] == "beta"
    restored = BetaCalibrator._from_state(data["params"], data["state"])
    np.testing.assert_array_equal(restored.predict(queries), out)
    json.dumps(calibrator.fit_info())
