"""lp_patch, Algorithm 2 of papers/001 with the accuracy its holdout allows.

The paper's guarantee is about the distribution the holdout came from: with
probability >= 1 - delta, Err_p(h) <= epsilon. It is checked here on a large
independent sample from the same distribution (500 000 rows, whose own
estimation error is far below the bounds), not on the holdout.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError, fit_calibrator, from_dict, get_method
from calibd.calibration._multiclass import softmax
from calibd.calibration.lp_patch import (
    LpPatchCalibrator,
    canonical,
    log_level_sets,
    mass_accuracy,
    project_to_simplex,
    query_accuracy,
)
from calibd.metrics import lp_error


def overconfident(n: int, seed: int, k: int = 3, spread: float = 5.0, temperature: float = 5.0):
    """Softmax of N(0, spread^2) logits, labels drawn from softmax(z / temperature): far too confident."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, spread, (n, k))
    truth = softmax(z / temperature)
    labels = (truth.cumsum(axis=1) > rng.uniform(size=(n, 1))).argmax(axis=1)
    return softmax(z), labels


def rho_of_rounded(p: np.ndarray, lam: int = 10) -> np.ndarray:
    """rho(R(f)) written out: v = floor(lam f) / lam plus an even share of 1 - sum v."""
    codes = np.floor(lam * p).astype(np.int64)
    return codes / lam + ((lam - codes.sum(axis=1, keepdims=True)) / (lam * p.shape[1]))


@pytest.fixture(scope="module")
def fitted():
    p, y = overconfident(1_000_000, seed=1)
    calibrator = LpPatchCalibrator().fit(p, y)
    test_p, test_y = overconfident(500_000, seed=2)
    return calibrator, test_p, test_y


def test_patching_lowers_the_held_out_lp_error(fitted):
    calibrator, test_p, test_y = fitted
    info = calibrator.fit_info()
    assert info["patched_groups"] >= 1 and info["converged"]
    out = calibrator.predict(test_p)
    after = lp_error(out, test_y, p=2)
    assert after < 0.5 * lp_error(test_p, test_y, p=2)
    # The gain is the patching's, not the rounding's.
    assert after < 0.5 * lp_error(rho_of_rounded(test_p), test_y, p=2)


@pytest.mark.parametrize("p", [2, 3, "inf"])
def test_held_out_error_is_within_the_reported_epsilon(fitted, p):
    calibrator, test_p, test_y = fitted
    if p != 2:
        calibrator = LpPatchCalibrator(p=p).fit(*overconfident(1_000_000, seed=1))
    info = calibrator.fit_info()
    out = calibrator.predict(test_p)
    b = info["cell_error_bound"]
    order = math.inf if p == "inf" else p
    expected = b if p == "inf" else (2 * b ** (order - 1)) ** (1 / order)
    assert info["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert lp_error(out, test_y, p=p) <= info["epsilon"]
    # Lemma 14 bounds every cell by b.
    assert lp_error(out, test_y, p="inf") <= b


def test_outputs_are_rho_of_the_bin_off_the_patched_groups_and_one_constant_on_each(fitted):
    calibrator, test_p, _ = fitted
    out = calibrator.predict(test_p)
    codes = np.floor(10 * test_p).astype(np.int64)
    in_group = np.full(test_p.shape[0], -1)
    for index, group in enumerate(calibrator.groups_):
        for member in group["bins"]:
            in_group[(codes == np.array(member)).all(axis=1)] = index
    unpatched = in_group < 0
    assert unpatched.sum() > 0 and (~unpatched).sum() > 0
    np.testing.assert_array_equal(out[unpatched], rho_of_rounded(test_p[unpatched]))
    for index, group in enumerate(calibrator.groups_):
        rows = out[in_group == index]
        assert rows.shape[0] > 0
        np.testing.assert_array_equal(rows, np.broadcast_to(np.array(group["value"]), rows.shape))


def test_rows_sum_to_one_and_lie_in_the_unit_interval(fitted):
    calibrator, test_p, _ = fitted
    out = calibrator.predict(test_p)
    assert np.abs(out.sum(axis=1) - 1.0).max() <= 1e-12
    assert out.min() >= 0.0 and out.max() <= 1.0
    for group in calibrator.groups_:
        assert abs(sum(group["value"]) - 1.0) <= 1e-12


def test_groups_whose_patches_share_a_level_set_are_merged():
    # Two bins, (9, 0, 0) and (8, 1, 0), with one true distribution inside the level set (6, 1, 1).
    rng = np.random.default_rng(5)
    n = 2_000_000
    p = np.where(rng.uniform(size=(n, 1)) < 0.5, [0.95, 0.03, 0.02], [0.85, 0.1, 0.05])
    truth = np.array([0.65, 0.175, 0.175])
    y = (truth.cumsum() > rng.uniform(size=(n, 1))).argmax(axis=1)
    calibrator = LpPatchCalibrator().fit(p, y)
    info = calibrator.fit_info()
    assert info["high_mass_bins"] == 2 and info["patched_groups"] == 1 and info["patched_bins"] == 2
    out = calibrator.predict(np.array([[0.95, 0.03, 0.02], [0.85, 0.1, 0.05]]))
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(np.floor(10 * out[0]), [6, 1, 1])
    # Each class's error over the merged group is within the bound.
    assert np.abs(out[0] - truth).max() <= info["cell_error_bound"]


def test_a_small_holdout_patches_nothing_and_gives_rho_everywhere():
    p, y = overconfident(2000, seed=3)
    calibrator = LpPatchCalibrator().fit(p, y)
    info = calibrator.fit_info()
    assert info["patched_groups"] == 0 and calibrator.groups_ == []
    assert info["alpha"] > 0.3 and 0 < info["epsilon"] <= 2 ** 0.5
    np.testing.assert_array_equal(calibrator.predict(p), rho_of_rounded(p))


def test_the_same_seed_gives_the_same_fit():
    p, y = overconfident(300_000, seed=4, spread=6.0, temperature=6.0)
    first = LpPatchCalibrator(seed=7).fit(p, y)
    second = LpPatchCalibrator(seed=7).fit(p, y)
    assert first.groups_ and first.to_dict() == second.to_dict()


def test_json_round_trip_predicts_identically(fitted):
    calibrator, test_p, _ = fitted
    text = json.dumps(calibrator.to_dict())
    rebuilt = from_dict(json.loads(text))
    assert isinstance(rebuilt, LpPatchCalibrator) and rebuilt.n_classes_ == 3
    np.testing.assert_array_equal(rebuilt.predict(test_p[:50_000]), calibrator.predict(test_p[:50_000]))


def test_logit_input_goes_through_softmax():
    rng = np.random.default_rng(6)
    z = rng.normal(0, 3, (3000, 4))
    y = rng.integers(0, 4, 3000)
    by_logit = LpPatchCalibrator(input="logit").fit(z, y).predict(z)
    np.testing.assert_array_equal(by_logit, rho_of_rounded(softmax(z)))


@pytest.mark.parametrize(
    "options, field",
    [
        ({"lambda": 0}, "options.lambda"),
        ({"lambda": 2.5}, "options.lambda"),
        ({"lambda": True}, "options.lambda"),
        ({"lambda": "10"}, "options.lambda"),
        ({"lambda": 10, "lam": 10}, "options.lambda"),
        ({"p": 1}, "options.p"),
        ({"p": 0.5}, "options.p"),
        ({"p": "two"}, "options.p"),
        ({"delta": 0}, "options.delta"),
        ({"delta": 1}, "options.delta"),
        ({"delta": "0.1"}, "options.delta"),
        ({"seed": -1}, "options.seed"),
        ({"seed": 1.5}, "options.seed"),
        ({"epsilon": 0.1}, "options.epsilon"),
    ],
)
def test_bad_options_name_the_field(options, field):
    with pytest.raises(CalibrationInputError) as error:
        get_method("lp_patch").from_options("probability", options)
    assert error.value.field == field


def test_options_by_their_documented_names():
    calibrator = get_method("lp_patch").from_options("logit", {"lambda": 20, "p": "inf", "delta": 0.05, "seed": 3})
    assert calibrator.get_params() == {"input": "logit", "p": "inf", "lam": 20, "delta": 0.05, "seed": 3}


def test_fit_summary_reports_the_epsilon_reached():
    p, y = overconfident(1500, seed=8)
    result = fit_calibrator("lp_patch", "probability", {"p": 3}, p.tolist(), y.tolist())
    fit = result.summary["fit"]
    assert json.loads(json.dumps(result.summary, allow_nan=False)) == result.summary
    assert fit["p"] == 3.0 and fit["lambda"] == 10 and fit["pools"] == 1 + 2 * fit["size_levels"]
    assert fit["epsilon"] == pytest.approx((2 * fit["cell_error_bound"] ** 2) ** (1 / 3))


# --- the pieces, against known answers -------------------------------------------------------


def test_projection_onto_the_simplex():
    np.testing.assert_allclose(project_to_simplex(np.array([0.5, 0.5, 0.5])), [1 / 3] * 3)
    np.testing.assert_allclose(project_to_simplex(np.array([1.2, 0.1, 0.0])), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(project_to_simplex(np.array([0.6, 0.6, 0.0])), [0.5, 0.5, 0.0])
    inside = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(project_to_simplex(inside), inside)
    # Optimality: u - z is theta on the support and >= theta off it (KKT).
    rng = np.random.default_rng(0)
    for _ in range(100):
        z = rng.uniform(-0.5, 1.5, 7)
        u = project_to_simplex(z)
        assert abs(u.sum() - 1) < 1e-12 and u.min() >= 0
        shift = z - u
        theta = shift[u > 0]
        assert np.ptp(theta) < 1e-12 and (shift[u == 0] <= theta[0] + 1e-12).all()


def test_canonical_point_of_a_level_set():
    np.testing.assert_allclose(canonical(np.array([3, 3, 3]), 10), [1 / 3] * 3)
    np.testing.assert_array_equal(canonical(np.array([10, 0, 0]), 10), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(canonical(np.array([5, 2, 0]), 10), [0.6, 0.3, 0.1])
    # R(rho(v)) = v.
    rng = np.random.default_rng(1)
    codes = np.floor(10 * rng.dirichlet([0.5] * 5, size=1000)).astype(np.int64)
    np.testing.assert_array_equal(np.floor(10 * canonical(codes, 10)), codes)


def test_accuracies_invert_the_sample_counts():
    m, n_queries, k, delta = 50_000.0, 7, 10, 0.01
    alpha = query_accuracy(m, n_queries, k, delta)
    assert 32 * math.log(4 * n_queries * k / delta) / alpha**2 == pytest.approx(m, rel=1e-12)
    assert query_accuracy(0, 1, 3, 0.1) == math.inf
    log_v = log_level_sets(10, 3)
    assert math.exp(log_v) == pytest.approx(math.comb(13, 3))
    a = mass_accuracy(m, log_v, delta)
    needed = math.log(4 / (a * delta)) / (2 * a * a) + 4 * math.log(2 * math.comb(13, 3) / delta) / (3 * a)
    assert needed == pytest.approx(m, rel=1e-9)
    assert mass_accuracy(3.0, log_v, delta) == 1.0
