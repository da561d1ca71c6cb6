"""Angular calibration (papers/000): the corrected angle estimator in simulation, the predictor's
quadrature, serialisation, and bad input."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.linalg import cholesky
from scipy.signal import lfilter
from scipy.special import ndtr

from calibd.calibration import CalibrationInputError, angular, fit_calibrator, from_dict, get_method
from calibd.calibration.angular import (
    AngularCalibrator,
    corrected_gamma,
    estimate_inner_product_squared,
    expected_link,
    fit_ridge_logistic,
    normal_expectation,
    platt_equivalent,
    printed_gamma,
    quadrature_rule,
    stationarity,
)
from calibd.calibration.scales import sigmoid

LINK = {"family": "logistic", "scale": 3.0, "offset": 1.0}


def toeplitz_rows(rng: np.random.Generator, rows: int, d: int) -> np.ndarray:
    """Rows of N(0, Sigma), Sigma_kl = 0.5^|k-l| / d (section 7.1): an AR(1) recursion along each row."""
    noise = rng.standard_normal((rows, d))
    noise[:, 0] /= math.sqrt(0.75)
    return lfilter([math.sqrt(0.75)], [1.0, -0.5], noise, axis=1) / math.sqrt(d)


def simulate(seed: int, n: int = 400, d: int = 800, n_holdout: int = 200, ridge: float = 0.5, link=LINK):
    """Section 7.1's simulation at a smaller size with the same n/d: training data, the ridge
    logistic fit, a labelled holdout, and the true <w*, w_hat>_Sigma."""
    rng = np.random.default_rng(seed)
    k = np.arange(d)
    Sigma = 0.5 ** np.abs(k[:, None] - k[None, :]) / d
    w_star = rng.standard_normal(d)
    w_star /= math.sqrt(w_star @ Sigma @ w_star)
    family = sigmoid if link["family"] == "logistic" else ndtr

    def labels(x):
        return (rng.uniform(size=x.shape[0]) < family(link["scale"] * (x @ w_star) + link["offset"])).astype(int)

    X = toeplitz_rows(rng, n, d)
    y = labels(X)
    w_hat = fit_ridge_logistic(X, y, ridge)
    X_holdout = toeplitz_rows(rng, n_holdout, d)
    return SimpleNamespace(
        X=X, y=y, w_hat=w_hat, Sigma=Sigma, w_star=w_star, ridge=ridge, rng=rng, labels=labels,
        u_holdout=X_holdout @ w_hat, y_holdout=labels(X_holdout), true_inner=float(w_star @ Sigma @ w_hat),
    )


def fit(sim, **options) -> AngularCalibrator:
    options = {"lambda": sim.ridge, "link": LINK} | options
    calibrator = AngularCalibrator.from_options("logit", options)
    return calibrator.fit(sim.u_holdout, sim.y_holdout, X=sim.X, y=sim.y, w_hat=sim.w_hat, Sigma=sim.Sigma)


@pytest.fixture(scope="module")
def sims():
    return [simulate(seed) for seed in range(8)]


@pytest.fixture(scope="module")
def small():
    return simulate(11, n=200, d=100, n_holdout=300)


# -- the corrected estimator ----------------------------------------------------


def test_corrected_gamma_estimates_the_inner_product_and_the_printed_one_does_not(sims, monkeypatch):
    true = np.array([s.true_inner for s in sims])
    corrected = np.array([fit(s).inner_product_ for s in sims])
    # Unbiased on average over the seeds; each seed within the estimator's n^-1/2 noise.
    assert abs(corrected.mean() - true.mean()) < 0.05, (corrected, true)
    assert np.abs(corrected - true).mean() < 0.1, (corrected, true)

    # The same calibrator with the gamma printed in the paper, Tr(X H X'D): a2 in the thousands
    # against a true value near 0.2, so the angle collapses to 0 (cos clipped at 1).
    monkeypatch.setattr(angular, "gamma_normalisation", printed_gamma)
    printed = [fit(s) for s in sims]
    assert all(p.inner_product_squared_ > 100 * s.true_inner**2 for p, s in zip(printed, sims))
    printed_inner = np.array([p.inner_product_ for p in printed])
    assert np.abs(printed_inner - true).mean() > 0.3, (printed_inner, true)
    assert all(p.diagnostics_["clipped"] and p.theta_ == 0.0 for p in printed)


def test_the_gamma_correction_is_the_leave_one_out_factor(small):
    """gamma = Tr(XHX'D) / Tr(D - DXHX'D) against its definition, the mean of x_i'H(-i)x_i."""
    X, y, w = small.X, small.y, small.w_hat
    n, d = X.shape
    p = sigmoid(X @ w)
    D = p * (1 - p)
    c = n * small.ridge / d
    H = np.linalg.inv((X * D[:, None]).T @ X + c * np.eye(d))
    trace_xhxd = float(np.sum((X @ H) * X, axis=1) @ D)
    trace_rest = float(D.sum() - np.sum((X @ H) * X, axis=1) @ D**2)
    leave_one_out = []
    for i in range(0, n, 10):
        H_minus_i = np.linalg.inv(np.linalg.inv(H) - D[i] * np.outer(X[i], X[i]))
        leave_one_out.append(X[i] @ H_minus_i @ X[i])
    gamma = corrected_gamma(trace_xhxd, trace_rest, n)
    assert gamma == pytest.approx(np.mean(leave_one_out), rel=0.05)
    assert printed_gamma(trace_xhxd, trace_rest, n) > 20 * gamma
    # The module's O(min(n, d)^3) computation agrees with the direct one.
    estimate = estimate_inner_product_squared(X, y, w, cholesky(small.Sigma, lower=True), small.ridge)
    assert estimate["gamma"] == pytest.approx(gamma, rel=1e-8)
    assert estimate["v"] == pytest.approx(trace_rest / n, rel=1e-8)


def test_both_leverage_branches_agree(small):
    """d < n takes the d x d factorisation, d >= n the n x n one: the same numbers."""
    factor = cholesky(small.Sigma, lower=True)
    wide = estimate_inner_product_squared(small.X, small.y, small.w_hat, factor, small.ridge)
    X, y = small.X[:90], small.y[:90]  # n = 90 < d = 100
    w = fit_ridge_logistic(X, y, small.ridge)
    narrow = estimate_inner_product_squared(X, y, w, factor, small.ridge)
    h_direct = angular.leverages(X, np.full(90, 0.2), 0.7)
    Z = X * math.sqrt(0.2)
    expected = np.diag(Z @ np.linalg.inv(Z.T @ Z + 0.7 * np.eye(100)) @ Z.T)
    np.testing.assert_allclose(h_direct, expected, rtol=1e-9)
    h_tall = angular.leverages(small.X, np.full(200, 0.2), 0.7)
    Z = small.X * math.sqrt(0.2)
    np.testing.assert_allclose(h_tall, np.diag(Z @ np.linalg.inv(Z.T @ Z + 0.7 * np.eye(100)) @ Z.T), rtol=1e-9)
    assert wide["gamma"] > 0 and narrow["gamma"] > 0


def test_fit_ridge_logistic_is_stationary_in_the_papers_convention(small):
    assert stationarity(small.X, small.y, small.w_hat, small.ridge) < 1e-10
    from sklearn.linear_model import LogisticRegression

    n, d = small.X.shape
    model = LogisticRegression(C=d / (n * small.ridge), fit_intercept=False, tol=1e-12, max_iter=10_000)
    np.testing.assert_allclose(model.fit(small.X, small.y).coef_.ravel(), small.w_hat, rtol=1e-4, atol=1e-6)


def test_sign_comes_from_the_holdout_and_a_negative_sign_mirrors_the_predictor(small):
    forward = fit(small)
    assert forward.sign_ == 1 and forward.sign_margin_ > 2
    # A holdout on which u and y are anti-correlated: eq. (12) gives -1, and theta becomes pi - theta.
    flipped = AngularCalibrator(ridge=small.ridge, link=LINK).fit(
        -small.u_holdout, small.y_holdout, X=small.X, y=small.y, w_hat=small.w_hat, Sigma=small.Sigma
    )
    assert flipped.sign_ == -1 and flipped.sign_margin_ == pytest.approx(-forward.sign_margin_, rel=0.5)
    assert flipped.theta_ == pytest.approx(math.pi - forward.theta_)
    assert flipped.inner_product_ == pytest.approx(-forward.inner_product_)
    u = np.linspace(-4, 4, 41)
    np.testing.assert_allclose(flipped.predict(-u), forward.predict(u), atol=1e-12)
    assert np.all(np.diff(flipped.predict(u)) <= 0)


def test_the_centred_sign_statistic_errs_far_less_often_than_eq_12():
    """At section 7.1's operating point (<w*, w_hat> ~ 0.44, ||w_hat||_Sigma ~ 0.85, 70% positives)
    eq. (12) errs about 1% of the time on 100 points (the paper: 0.89%); the centred statistic almost never."""
    rng = np.random.default_rng(0)
    inner, norm, trials = 0.44, 0.85, 4000
    g = rng.standard_normal((trials, 100))
    u = inner * g + math.sqrt(norm**2 - inner**2) * rng.standard_normal((trials, 100))
    y = (rng.uniform(size=g.shape) < sigmoid(3 * g + 1)).astype(float)
    ones = np.ones(100)
    paper = np.mean([angular.sign_from_holdout(u[i], y[i], ones)[0] != 1 for i in range(trials)])
    centered = np.mean([angular.sign_from_holdout(u[i], y[i], ones, centered=True)[0] != 1 for i in range(trials)])
    assert 0.003 < paper < 0.025
    assert centered < 0.001


def test_sign_estimator_option(small):
    paper, centered = fit(small, sign_estimator="paper"), fit(small)
    assert centered.theta_ == paper.theta_  # same sign here, same magnitude always
    assert centered.fit_info()["sign_estimator"] == "centered"
    assert abs(centered.sign_margin_) > abs(paper.sign_margin_)


def test_fit_info_reports_angle_inner_product_sign_and_margin(small):
    info = fit(small).fit_info()
    assert info["angle"] == pytest.approx(math.acos(info["inner_product"] / info["w_hat_norm_sigma"]))
    assert info["angle_degrees"] == pytest.approx(math.degrees(info["angle"]))
    assert info["inner_product"] == pytest.approx(math.sqrt(info["inner_product_squared"]))
    assert info["sign"] == 1 and info["sign_margin"] > 0 and info["sign_statistic"] > 0
    assert info["n_train"] == 200 and info["dimension"] == 100 and info["n_holdout"] == 300
    json.dumps(info)


def test_labels_minus_one_plus_one_are_the_same_as_zero_one(small):
    zero_one = fit(small)
    plus_minus = AngularCalibrator(ridge=small.ridge, link=LINK).fit(
        small.u_holdout, small.y_holdout, X=small.X, y=2 * small.y - 1, w_hat=small.w_hat, Sigma=small.Sigma
    )
    assert plus_minus.theta_ == zero_one.theta_


def test_an_unlabeled_pool_estimates_sigma(small):
    pool = toeplitz_rows(np.random.default_rng(5), 50_000, 100)
    from_pool = AngularCalibrator(ridge=small.ridge, link=LINK).fit(
        small.u_holdout, small.y_holdout, X=small.X, y=small.y, w_hat=small.w_hat, X_unlabeled=pool
    )
    known = fit(small)
    assert from_pool.diagnostics_["sigma_from"] == "X_unlabeled"
    assert from_pool.w_norm_sigma_ == pytest.approx(known.w_norm_sigma_, rel=0.02)
    assert from_pool.inner_product_ == pytest.approx(known.inner_product_, abs=0.05)


def test_cross_fitting_reuses_the_training_computation(small, monkeypatch):
    calls = []
    original = angular.estimate_inner_product_squared

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(angular, "estimate_inner_product_squared", counting)
    monkeypatch.setattr(angular, "_cache", angular.OrderedDict())
    X = small.X.copy()
    result = fit_calibrator(
        "angular", "logit", {"lambda": small.ridge, "link": LINK}, small.u_holdout, small.y_holdout,
        arrays={"X": X, "y": small.y, "w_hat": small.w_hat, "Sigma": small.Sigma},
    )
    assert len(calls) == 1  # the fit and its five cross-fitting refits
    assert result.summary["after"]["log_loss"] < result.summary["before"]["log_loss"]
    X[0, 0] += 1.0  # different content is computed afresh
    AngularCalibrator(ridge=small.ridge, link=LINK, stationarity_tol=None).fit(
        small.u_holdout, small.y_holdout, X=X, y=small.y, w_hat=small.w_hat, Sigma=small.Sigma
    )
    assert len(calls) == 2


# -- the predictor ---------------------------------------------------------------


@pytest.mark.parametrize("spread", [0.1, 1.0, 2.0, 2.5])
def test_gauss_hermite_matches_the_probit_closed_form(spread):
    mean = np.linspace(-8, 8, 81)
    kind, points, _ = quadrature_rule(spread, 40)
    assert kind == "gauss-hermite" and points.shape == (40,)
    quadrature = normal_expectation(ndtr, mean, spread, 40)
    np.testing.assert_allclose(quadrature, ndtr(mean / math.sqrt(1 + spread**2)), atol=1e-6)
    np.testing.assert_array_equal(expected_link(mean, spread, "probit"), ndtr(mean / math.sqrt(1 + spread**2)))


@pytest.mark.parametrize("spread", [0.5, 2.6, 5.0, 30.0])
def test_logistic_quadrature_matches_monte_carlo_and_adaptive_quadrature(spread):
    from scipy.integrate import quad

    mean = np.array([-40.0, -6.0, -2.0, -0.3, 0.0, 1.0, 4.0])
    z = np.random.default_rng(0).standard_normal(400_000)
    draws = sigmoid(mean[:, None] + spread * z[None, :])
    error = draws.std(axis=1) / math.sqrt(z.shape[0])
    quadrature = expected_link(mean, spread, "logistic", 40)
    assert np.all(np.abs(quadrature - draws.mean(axis=1)) < 4 * error + 1e-9)
    exact = [
        quad(lambda t, m=m: float(sigmoid(np.array(m + spread * t))) * math.exp(-t * t / 2) / math.sqrt(2 * math.pi),
             -12, 12, points=[-m / spread], epsabs=1e-14, limit=500)[0]
        for m in mean
    ]
    np.testing.assert_allclose(quadrature, exact, rtol=0, atol=2e-6)
    # Steep links leave Gauss-Hermite's range for the trapezoid rule, without losing accuracy.
    assert quadrature_rule(spread, 40)[0] == ("gauss-hermite" if spread < 2.9 else "trapezoid")


def test_predictions_are_probabilities_monotone_and_equal_eq_3(small):
    calibrator = fit(small)
    assert math.cos(calibrator.theta_) > 0
    u = np.r_[-1e6, -300.0, np.linspace(-20, 20, 2001), 300.0, 1e6]
    p = calibrator.predict(u)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(np.diff(p) >= 0)
    # Eq. (3) by brute force at a few points.
    z = np.random.default_rng(1).standard_normal(400_000)
    theta, norm = calibrator.theta_, calibrator.w_norm_sigma_
    for value in (-2.0, 0.0, 1.5):
        direct = sigmoid(3.0 * (math.cos(theta) * value / norm + math.sin(theta) * z) + 1.0).mean()
        assert calibrator.predict(np.array([value]))[0] == pytest.approx(direct, abs=3e-3)
    # A batch larger than one quadrature block.
    big = np.random.default_rng(2).normal(0, 2, 20_000)
    np.testing.assert_allclose(calibrator.predict(big)[:50], calibrator.predict(big[:50]), rtol=0, atol=0)


def test_probit_link_is_platt_with_the_theoretical_a_and_b(small):
    sim = simulate(3, n=200, d=100, n_holdout=300, link={"family": "probit", "scale": 2.0, "offset": -0.5})
    calibrator = AngularCalibrator(ridge=sim.ridge, link={"family": "probit", "scale": 2.0, "offset": -0.5}).fit(
        sim.u_holdout, sim.y_holdout, X=sim.X, y=sim.y, w_hat=sim.w_hat, Sigma=sim.Sigma
    )
    A, B = platt_equivalent(calibrator.theta_, calibrator.w_norm_sigma_, 2.0, -0.5)
    u = np.linspace(-10, 10, 101)
    np.testing.assert_allclose(calibrator.predict(u), ndtr(2.0 * (A * u + B) - 0.5), rtol=1e-12, atol=1e-15)


def test_the_angular_predictor_is_calibrated_in_simulation(sims):
    from calibd.metrics import ece

    sim = sims[0]
    calibrator = fit(sim)
    rng = np.random.default_rng(99)
    X_test = toeplitz_rows(rng, 20_000, 800)
    u = X_test @ sim.w_hat
    labels = (rng.uniform(size=u.shape[0]) < sigmoid(3.0 * (X_test @ sim.w_star) + 1.0)).astype(int)
    assert ece(calibrator.predict(u), labels) < 0.04
    assert ece(sigmoid(u), labels) > 0.08


def test_round_trip_through_json_is_exact(small):
    calibrator = fit(small, quadrature_nodes=30)
    data = json.loads(json.dumps(calibrator.to_dict()))
    assert data["method"] == "angular"
    assert data["params"]["ridge"] == small.ridge and data["params"]["link"] == LINK
    assert len(json.dumps(data)) < 2000  # plain numbers: nothing of X is stored
    rebuilt = from_dict(data)
    u = np.linspace(-30, 30, 601)
    np.testing.assert_array_equal(rebuilt.predict(u), calibrator.predict(u))
    assert rebuilt.fit_info() == calibrator.fit_info()
    assert get_method("angular") is AngularCalibrator


def test_options_lambda_and_ridge():
    assert AngularCalibrator.from_options("logit", {"lambda": 0.5}).ridge == 0.5
    assert AngularCalibrator.from_options("logit", {"ridge": 0.5}).ridge == 0.5
    assert AngularCalibrator(ridge=1.0).set_params(**{"lambda": 2.0}).ridge == 2.0
    assert AngularCalibrator(ridge=1.0, link="probit").link_parameters() == ("probit", 1.0, 0.0)
    assert AngularCalibrator(ridge=1.0).link_parameters() == ("logistic", 1.0, 0.0)


# -- bad input ---------------------------------------------------------------------


OPTION_CASES = [
    ({}, "options.lambda"),
    ({"lambda": -1}, "options.lambda"),
    ({"lambda": True}, "options.lambda"),
    ({"lambda": 0.5, "ridge": 0.5}, "options.lambda"),
    ({"lambda": 0.5, "loss": "hinge"}, "options.loss"),
    ({"lambda": 0.5, "link": {"family": "cauchy"}}, "options.link.family"),
    ({"lambda": 0.5, "link": "cauchy"}, "options.link"),
    ({"lambda": 0.5, "link": {"family": "logistic", "scale": 0}}, "options.link.scale"),
    ({"lambda": 0.5, "link": {"family": "logistic", "offset": "1"}}, "options.link.offset"),
    ({"lambda": 0.5, "link": {"family": "logistic", "slope": 1}}, "options.link.slope"),
    ({"lambda": 0.5, "link": [1, 2]}, "options.link"),
    ({"lambda": 0.5, "quadrature_nodes": 1}, "options.quadrature_nodes"),
    ({"lambda": 0.5, "max_dimension": 0}, "options.max_dimension"),
    ({"lambda": 0.5, "max_dimension": 10**6}, "options.max_dimension"),
    ({"lambda": 0.5, "stationarity_tol": -1}, "options.stationarity_tol"),
    ({"lambda": 0.5, "sign_estimator": "median"}, "options.sign_estimator"),
    ({"lambda": 0.5, "n_bins": 3}, "options.n_bins"),
]


@pytest.mark.parametrize("options,field", OPTION_CASES)
def test_bad_options_name_the_option(options, field):
    with pytest.raises(CalibrationInputError) as error:
        AngularCalibrator.from_options("logit", options)
    assert error.value.field == field


def test_input_must_be_logit():
    with pytest.raises(CalibrationInputError) as error:
        AngularCalibrator.from_options("probability", {"lambda": 0.5})
    assert error.value.field == "input" and "logit" in error.value.detail


def _bad_arrays(small):
    d = small.X.shape[1]
    not_pd = small.Sigma.copy()
    not_pd[0, 0] = -1.0
    asymmetric = small.Sigma.copy()
    asymmetric[2, 5] += 0.1
    return [
        ("w_hat of the wrong length", {"w_hat": small.w_hat[:-1]}, "w_hat", "columns"),
        ("w_hat of zero", {"w_hat": np.zeros(d)}, "w_hat", "zero"),
        ("w_hat for another lambda", {"w_hat": fit_ridge_logistic(small.X, small.y, 2.0)}, "w_hat", "lambda"),
        ("y of the wrong length", {"y": small.y[:-1]}, "y", "rows"),
        ("y with a 2", {"y": np.r_[2, small.y[1:]]}, "y", "0 or 1"),
        ("y of one class", {"y": np.ones_like(small.y)}, "y", "both classes"),
        ("Sigma of the wrong shape", {"Sigma": small.Sigma[:-1, :-1]}, "Sigma", "columns"),
        ("Sigma not symmetric", {"Sigma": asymmetric}, "Sigma", "symmetric"),
        ("Sigma not positive definite", {"Sigma": not_pd}, "Sigma", "positive definite"),
        ("Sigma and X_unlabeled", {"X_unlabeled": small.X}, "Sigma", "not both"),
        ("neither Sigma nor X_unlabeled", {"Sigma": None}, "Sigma", "X_unlabeled"),
        ("X_unlabeled too short", {"Sigma": None, "X_unlabeled": small.X[:50]}, "X_unlabeled", "at least 100"),
        ("X_unlabeled of the wrong width", {"Sigma": None, "X_unlabeled": small.X[:, :-1]}, "X_unlabeled", "columns"),
        ("X_unlabeled rank-deficient", {"Sigma": None, "X_unlabeled": small.X * (np.arange(d) != 3)}, "X_unlabeled", "singular"),
        ("X missing", {"X": None}, "X", "required"),
        ("X with NaN", {"X": np.where(np.eye(*small.X.shape, dtype=bool), np.nan, small.X)}, "X", "finite"),
        ("an unknown array", {"features": small.X}, "features", "takes"),
    ]


def test_bad_arrays_name_the_field(small):
    for case, changes, field, fragment in _bad_arrays(small):
        arrays = {"X": small.X, "y": small.y, "w_hat": small.w_hat, "Sigma": small.Sigma} | changes
        arrays = {key: value for key, value in arrays.items() if value is not None}
        with pytest.raises(CalibrationInputError) as error:
            AngularCalibrator(ridge=small.ridge, link=LINK).fit(small.u_holdout, small.y_holdout, **arrays)
        assert error.value.field == field, case
        assert fragment in error.value.detail, (case, error.value.detail)


def test_dimension_above_the_limit_states_the_limit(small):
    with pytest.raises(CalibrationInputError) as error:
        AngularCalibrator(ridge=small.ridge, max_dimension=99).fit(
            small.u_holdout, small.y_holdout, X=small.X, y=small.y, w_hat=small.w_hat, Sigma=small.Sigma
        )
    assert error.value.field == "X"
    assert "100 columns" in error.value.detail and "limit of 99" in error.value.detail
