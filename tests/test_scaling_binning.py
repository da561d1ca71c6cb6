"""Scaling-binning: hand-computed binning, the reference implementation's outputs, properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibd.inputs import CalibrationInputError
from calibd.calibration.platt import PlattCalibrator
from calibd.calibration.scaling_binning import ScalingBinningCalibrator, binned_means, equal_count_edges

GRID = np.array([0.001, 0.01, 0.03, 0.07, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.93, 0.97, 0.99, 0.999])

# Output of benchmarks/reference/scaling_binning_reference.py: Kumar et al.'s
# PlattBinnerCalibrator (PyPI uncertainty-calibration). "bins" are its bin
# upper edges (the last is 1.0), "values" the bin outputs, "predictions" on
# GRID. Its Platt step is scikit-learn's lbfgs at default tolerance, so it
# agrees with calibd's Newton fit to about 1e-4.
SCALING_BINNING_REFERENCE = {'versions': {'uncertainty-calibration': '0.1.4', 'scikit-learn': '1.9.1', 'numpy': '2.4.6'},
 'n400_bins10': {'data': [400, 1.6, 0.7, 0.4, None],
                 'n_bins': 10,
                 'platt_a': 1.1849296487184606,
                 'platt_b': -0.3275752497659419,
                 'bins': [0.05094056763079841, 0.12389577936882137, 0.20871788558708948, 0.3085311528617737,
                          0.4171272156672934, 0.5393920304244364, 0.6620946197913011, 0.7880362338336803,
                          0.9042111962409931, 1.0],
                 'values': [0.022774286500015496, 0.086162108213457, 0.1653814212012684, 0.25801658489495144,
                            0.3620354341139307, 0.47760961469542396, 0.6004417794105243, 0.7247715831301116,
                            0.8468505344841943, 0.9558289539534259],
                 'predictions': [0.022774286500015496, 0.022774286500015496, 0.022774286500015496,
                                 0.022774286500015496, 0.086162108213457, 0.1653814212012684, 0.25801658489495144,
                                 0.3620354341139307, 0.47760961469542396, 0.6004417794105243, 0.7247715831301116,
                                 0.8468505344841943, 0.9558289539534259, 0.9558289539534259, 0.9558289539534259,
                                 0.9558289539534259]},
 'n103_bins7': {'data': [103, 0.8, 1.3, -0.2, None],
                'n_bins': 7,
                'platt_a': 0.8629856920986194,
                'platt_b': 0.18814235181608857,
                'bins': [0.21104811226221384, 0.3584247318472715, 0.4884830819082223, 0.6202557222605813,
                         0.7360359312700766, 0.8512570148820297, 1.0],
                'values': [0.11707899783083478, 0.2904139008424843, 0.4285213453019925, 0.5540877336269787,
                           0.677957279367303, 0.7948977782722835, 0.9178888046501593],
                'predictions': [0.11707899783083478, 0.11707899783083478, 0.11707899783083478, 0.11707899783083478,
                                0.2904139008424843, 0.2904139008424843, 0.4285213453019925, 0.5540877336269787,
                                0.5540877336269787, 0.677957279367303, 0.7948977782722835, 0.7948977782722835,
                                0.9178888046501593, 0.9178888046501593, 0.9178888046501593, 0.9178888046501593]},
 'ties_bins15': {'data': [200, 1.6, 0.7, 0.4, 1],
                 'n_bins': 15,
                 'platt_a': 1.2269328741213992,
                 'platt_b': -0.3263365477493731,
                 'bins': [0.04643369352211433, 0.11637380265970307, 0.20328077962769564, 0.30495443804495403,
                          0.4191322635919819, 0.5426813549928872, 0.6711169177512788, 0.7981148562950522,
                          0.9144725847327471, 1.0],
                 'values': [0.03673342221985001, 0.11637380265970305, 0.20328077962769564, 0.3049544380449539,
                            0.41913226359198197, 0.542681354992887, 0.6711169177512788, 0.7981148562950522,
                            0.914472584732747, 0.9639555551103712],
                 'predictions': [0.03673342221985001, 0.03673342221985001, 0.03673342221985001,
                                 0.03673342221985001, 0.11637380265970305, 0.20328077962769564, 0.3049544380449539,
                                 0.41913226359198197, 0.542681354992887, 0.6711169177512788, 0.7981148562950522,
                                 0.914472584732747, 0.9639555551103712, 0.9639555551103712, 0.9639555551103712,
                                 0.9639555551103712]},
 'ties_empty_bins': {'data': [100, 1.6, 0.7, 0.4, 1],
                     'n_bins': 30,
                     'platt_a': 1.1735193780873128,
                     'platt_b': -0.32940853122636793,
                     'bins': [0.02220972972126386, 0.051764703813328754, 0.12387325858576533, 0.2101985558319715,
                              0.30890794974885427, 0.41838454357747484, 0.47746122678182734, 0.5365379099861799,
                              0.6603629200056907, 0.7854029416895867, 0.8449869192937383, 0.9045708968978897,
                              0.9579504620417956, 1.0],
                     'values': [0.02220972972126386, 0.05176470381332875, 0.12387325858576533, 0.2101985558319715,
                                0.30890794974885427, 0.41838454357747484, 0.44792288517965106, 0.5365379099861799,
                                0.6603629200056906, 0.7854029416895866, 0.8151949304916625, 0.9045708968978896,
                                0.9579504620417956, 0.9789752310208978],
                     'predictions': [0.02220972972126386, 0.02220972972126386, 0.02220972972126386,
                                     0.05176470381332875, 0.12387325858576533, 0.2101985558319715,
                                     0.30890794974885427, 0.41838454357747484, 0.44792288517965106,
                                     0.6603629200056906, 0.7854029416895866, 0.9045708968978896,
                                     0.9579504620417956, 0.9789752310208978, 0.9789752310208978,
                                     0.9789752310208978]}}


def reference_data(n, a, b, c, decimals=None):
    """The data of benchmarks/reference/scaling_binning_reference.py (no random generator)."""
    i = np.arange(1, n + 1, dtype=np.float64)
    p = 0.0005 + 0.999 * np.mod(i * 2.0**0.5, 1.0)
    if decimals is not None:
        p = np.clip(np.round(p, decimals), 0.05, 0.95)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log1p(-p) + c)))
    labels = (np.mod(i * (1.0 + 5.0**0.5) / 2.0, 1.0) < truth).astype(np.int64)
    return p, labels


# -- the binning step, by hand ---------------------------------------------------------


def test_equal_runs():
    g = np.array([0.4, 0.1, 0.6, 0.3, 0.2, 0.5])
    edges, values, weights = binned_means(g, np.ones(6), 3)
    # Runs [0.1, 0.2], [0.3, 0.4], [0.5, 0.6]; edges halfway between runs.
    np.testing.assert_allclose(edges, [0.25, 0.45], rtol=1e-15)
    np.testing.assert_allclose(values, [0.15, 0.35, 0.55], rtol=1e-15)
    np.testing.assert_array_equal(weights, [2, 2, 2])


def test_uneven_runs_as_array_split():
    g = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    # np.array_split: 3, 2, 2.
    edges, values, _ = binned_means(g, np.ones(7), 3)
    np.testing.assert_allclose(edges, [0.35, 0.55], rtol=1e-15)
    np.testing.assert_allclose(values, [0.2, 0.45, 0.65], rtol=1e-15)
    # More bins than points: one run per point.
    np.testing.assert_allclose(equal_count_edges(g, 50), [0.15, 0.25, 0.35, 0.45, 0.55, 0.65], rtol=1e-15)
    assert equal_count_edges(g, 1).shape == (0,)


def test_ties_right_closed_bins_and_empty_bins():
    # Runs [0.1, 0.2], [0.2, 0.2], [0.6, 0.7]: edges 0.2 and 0.4. Bins are
    # right-closed, so every 0.2 is in the first bin and (0.2, 0.4] is empty:
    # it outputs its midpoint, 0.3.
    g = np.array([0.1, 0.2, 0.2, 0.2, 0.6, 0.7])
    edges, values, weights = binned_means(g, np.ones(6), 3)
    np.testing.assert_allclose(edges, [0.2, 0.4], rtol=1e-15)
    np.testing.assert_allclose(values, [0.175, 0.3, 0.65], rtol=1e-15)
    np.testing.assert_array_equal(weights, [4, 0, 2])
    # An empty last bin (0.5, 1] outputs 0.75.
    edges, values, _ = binned_means(np.array([0.1, 0.5, 0.5]), np.ones(3), 2)
    np.testing.assert_allclose(edges, [0.5])
    np.testing.assert_allclose(values, [1.1 / 3, 0.75], rtol=1e-15)
    # Repeated edges merge.
    edges, values, _ = binned_means(np.array([0.3] * 6), np.ones(6), 3)
    np.testing.assert_allclose(edges, [0.3])
    np.testing.assert_allclose(values, [0.3, 0.65], rtol=1e-15)


def test_weighted_bin_means():
    g = np.array([0.1, 0.2, 0.3, 0.4])
    edges, values, weights = binned_means(g, np.array([1.0, 3.0, 0.0, 0.0]), 2)
    np.testing.assert_allclose(edges, [0.25])  # bins by count, not weight
    # Second bin has weight 0: treated as empty, its midpoint (0.25 + 1) / 2.
    np.testing.assert_allclose(values, [(0.1 + 3 * 0.2) / 4, 0.625], rtol=1e-15)
    np.testing.assert_array_equal(weights, [4, 0])


# -- the calibrator, by hand -----------------------------------------------------------------


def three_groups():
    # Logits -ln 3, 0, ln 3 with positive rates 1/4, 1/2, 3/4: these lie on
    # sigmoid(z), so Platt's maximum-likelihood fit is exactly A = 1, B = 0
    # and its outputs are 0.25, 0.5 and 0.75, four of each.
    z = np.repeat([-np.log(3.0), 0.0, np.log(3.0)], 4)
    labels = np.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    return z, labels


def test_hand_computed_fit_on_three_groups():
    z, labels = three_groups()
    calibrator = ScalingBinningCalibrator(input="logit", n_bins=3).fit(z, labels)
    assert calibrator.platt_a_ == pytest.approx(1.0, abs=1e-9)
    assert calibrator.platt_b_ == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(calibrator.edges_, [0.375, 0.625], atol=1e-9)
    np.testing.assert_allclose(calibrator.values_, [0.25, 0.5, 0.75], atol=1e-9)
    np.testing.assert_allclose(calibrator.predict(z), np.repeat([0.25, 0.5, 0.75], 4), atol=1e-9)


def test_hand_computed_ties_give_empty_bins():
    z, labels = three_groups()
    # Six runs of two: edges 0.25, 0.375, 0.5, 0.625, 0.75; the bins just
    # above each group hold nothing and output their midpoints.
    calibrator = ScalingBinningCalibrator(input="logit", n_bins=6).fit(z, labels)
    np.testing.assert_allclose(calibrator.edges_, [0.25, 0.375, 0.5, 0.625, 0.75], atol=1e-9)
    np.testing.assert_allclose(calibrator.values_, [0.25, 0.3125, 0.5, 0.5625, 0.75, 0.875], atol=1e-9)
    np.testing.assert_array_equal(calibrator.bin_weights_, [4, 0, 4, 0, 4, 0])
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731 - Platt with A = 1, B = 0 is the identity
    queries = logit(np.array([0.1, 0.3, 0.45, 0.55, 0.7, 0.9]))
    np.testing.assert_allclose(calibrator.predict(queries), [0.25, 0.3125, 0.5, 0.5625, 0.75, 0.875], atol=1e-9)


def test_reuses_platt_and_bins_its_outputs():
    rng = np.random.default_rng(3)
    p = rng.beta(2.0, 4.0, 3000)
    y = (rng.random(3000) < p**0.7).astype(int)
    w = rng.uniform(0.5, 2.0, 3000)
    calibrator = ScalingBinningCalibrator(n_bins=15).fit(p, y, w)
    platt = PlattCalibrator().fit(p, y, w)
    assert (calibrator.platt_a_, calibrator.platt_b_) == (platt.a_, platt.b_)
    g = platt.predict(p)
    edges, values, weights = binned_means(g, w, 15)
    np.testing.assert_array_equal(calibrator.edges_, edges)
    np.testing.assert_array_equal(calibrator.values_, values)
    assert calibrator.values_.shape == (15,)
    np.testing.assert_array_equal(calibrator.predict(p), values[np.searchsorted(edges, g, side="left")])
    info = calibrator.fit_info()
    assert info["platt"] == {"a": platt.a_, "b": platt.b_} and info["n_bins"] == 15
    json.dumps(info)


# -- against uncertainty-calibration -----------------------------------------------------


@pytest.mark.parametrize("name", [k for k in SCALING_BINNING_REFERENCE if k != "versions"])
def test_matches_reference_implementation(name):
    ref = SCALING_BINNING_REFERENCE[name]
    scores, labels = reference_data(*ref["data"])
    calibrator = ScalingBinningCalibrator(n_bins=ref["n_bins"]).fit(scores, labels)
    assert calibrator.platt_a_ == pytest.approx(ref["platt_a"], abs=1e-3)
    assert calibrator.platt_b_ == pytest.approx(ref["platt_b"], abs=1e-3)
    assert ref["bins"][-1] == 1.0
    np.testing.assert_allclose(calibrator.edges_, ref["bins"][:-1], rtol=0, atol=2e-4)
    np.testing.assert_allclose(calibrator.values_, ref["values"], rtol=0, atol=2e-4)
    # Grid points whose Platt output is not within the fits' difference of an edge.
    g = calibrator._platt().predict(GRID)
    clear = np.min(np.abs(g[:, None] - calibrator.edges_[None, :]), axis=1) > 1e-3
    assert clear.sum() >= 12
    np.testing.assert_allclose(calibrator.predict(GRID)[clear], np.asarray(ref["predictions"])[clear], rtol=0, atol=2e-4)


def test_bad_options():
    for options, field in [
        ({"n_bins": 0}, "options.n_bins"),
        ({"n_bins": -3}, "options.n_bins"),
        ({"n_bins": 10.0}, "options.n_bins"),
        ({"n_bins": None}, "options.n_bins"),
        ({"smooth_targets": True}, "options.smooth_targets"),
    ]:
        with pytest.raises(CalibrationInputError) as excinfo:
            ScalingBinningCalibrator.from_options("probability", options)
        assert excinfo.value.field == field


# -- properties -------------------------------------------------------------------------------


@st.composite
def holdouts(draw):
    n = draw(st.integers(10, 80))
    values = st.sampled_from([0.0, 0.2, 0.5, 0.7, 1.0]) if draw(st.booleans()) else st.floats(0.0, 1.0)
    scores = draw(st.lists(values, min_size=n, max_size=n))
    labels = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    labels[:4] = [0, 0, 1, 1]
    return np.array(scores), np.array(labels)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holdouts(), st.integers(1, 30), st.lists(st.floats(0.0, 1.0), max_size=20))
def test_properties(holdout, n_bins, queries):
    scores, labels = holdout
    calibrator = ScalingBinningCalibrator(n_bins=n_bins).fit(scores, labels)
    queries = np.sort(np.concatenate([queries, scores, [0.0, 1.0]]))
    out = calibrator.predict(queries)
    assert ((out >= 0) & (out <= 1)).all()
    assert calibrator.values_.shape[0] <= n_bins
    assert np.unique(out).shape[0] <= n_bins
    # Bin values increase with the bin, so the output follows Platt's direction.
    assert (np.diff(calibrator.values_) >= 0).all()
    direction = np.diff(out) * np.sign(calibrator.platt_a_)
    assert (direction >= 0).all()
    data = json.loads(json.dumps(calibrator.to_dict()))
    assert data["method"] == "scaling_binning"
    restored = ScalingBinningCalibrator._from_state(data["params"], data["state"])
    np.testing.assert_array_equal(restored.predict(queries), out)
