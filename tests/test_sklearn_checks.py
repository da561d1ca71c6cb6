"""scikit-learn's own estimator checks pass on every registered calibrator, with the tags it declares.

The checks draw X from make_blobs, normal and uniform draws, so they run on ``input="logit"``
(any finite real); ``input="probability"`` only narrows the accepted range to [0, 1], which no
scikit-learn tag expresses. A check that does not apply is declared by the method, with its
reason, in ``expected_failed_checks()``; the test also asserts that each declared check does fail.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from calibd.calibration import METHODS, CalibrationInputError, NotFittedError

BINARY_ONLY = [name for name, cls in METHODS.items() if cls.tasks == ("binary",) and name != "angular"]


# auto cross-validates each candidate on every fit: two keep its checks to seconds (every
# candidate passes the checks on its own).
OPTIONS = {"auto": {"candidates": ["temperature", "vector"]}}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_check_estimator_passes(name):
    calibrator = METHODS[name](input="logit", **OPTIONS.get(name, {}))
    expected = calibrator.expected_failed_checks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(calibrator, expected_failed_checks=expected, on_fail=None)
    failed = {r["check_name"]: repr(r["exception"]) for r in results if r["status"] == "failed"}
    assert not failed, failed
    # A declared exception that no longer fails is stale: drop it from the method's list.
    unexpected_passes = {r["check_name"] for r in results if r["status"] == "passed" and r["expected_to_fail"]}
    assert not unexpected_passes
    ran = {r["check_name"] for r in results if r["status"] == "passed"}
    assert len(ran) >= 17 and "check_estimators_unfitted" in ran  # never the whole suite skipped


def _binary_holdout(n=200, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, n)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-(0.7 * z - 0.3)))).astype(int)
    return z, y


# Weights act as repeated rows, except where the method's own design decides otherwise.
NOT_WEIGHT_AS_REPEAT = {
    "scaling_binning": "its bins hold equal numbers of rows (Kumar et al.), so a repeat moves bin edges and a weight does not",
    "multicalibration": "its early-stopping rows (validation_fraction) are drawn by row, so a row's repeats fall on both sides",
}


@pytest.mark.parametrize("name", BINARY_ONLY)
def test_binary_calibrators_take_flat_scores_as_the_checks_would_on_them(name):
    """The properties of the checks that scikit-learn cannot run on 1-D X (see ONE_D_INDEXING)."""
    z, y = _binary_holdout()
    calibrator = METHODS[name](input="logit")
    params = calibrator.get_params()
    with pytest.raises(NotFittedError):
        calibrator.predict(z)
    fitted = calibrator.fit(z, y)
    assert fitted is calibrator and calibrator.get_params() == params  # check_dont_overwrite_parameters
    public = {k for k in vars(calibrator) if not k.startswith("_") and not k.endswith("_")}
    assert public == set(params)
    assert calibrator.n_features_in_ == 1 and list(calibrator.classes_) == [0, 1]
    p = calibrator.predict(z)
    state = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(calibrator).items()}
    calibrator.predict(z[:7])
    assert vars(calibrator).keys() == state.keys()  # check_dict_unchanged
    # One column is the same input; any order and any subset give the same rows (sample order
    # and subset invariance); float32, ints, F-ordered and object arrays of numbers are numbers.
    np.testing.assert_array_equal(calibrator.predict(z[:, None]), p)
    order = np.random.default_rng(1).permutation(z.shape[0])
    np.testing.assert_allclose(calibrator.predict(z[order]), p[order], rtol=0, atol=1e-12)
    np.testing.assert_allclose(calibrator.predict(z[50:90]), p[50:90], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(calibrator.predict(np.asfortranarray(z[:, None])), p)
    np.testing.assert_array_equal(clone(calibrator).fit(z.astype(object), y).predict(z.astype(object)), p)
    clone(calibrator).fit(z.astype(np.float32), y).predict(np.round(z).astype(np.int32))
    # The same labels under other names: the larger is the positive class.
    np.testing.assert_allclose(clone(calibrator).fit(z, np.where(y == 1, 7, -2)).predict(z), p, rtol=0, atol=1e-12)
    # Refusals in scikit-learn's words.
    with pytest.raises(TypeError, match="argument must be .* string.* number"):
        clone(calibrator).fit(np.array([*z[:-1], {"a": 1}], dtype=object), y)
    with pytest.raises(ValueError, match="sparse"):
        clone(calibrator).fit(sparse.csr_array(z[None, :]), y)
    with pytest.raises(ValueError, match="Reshape your data"):
        calibrator.predict(z[0])
    with pytest.raises(ValueError, match="n_samples=1"):
        clone(calibrator).fit(z[:1], y[:1])
    with pytest.raises(ValueError, match="one score per row"):
        clone(calibrator).fit(np.column_stack([z, z]), y)
    with pytest.raises(ValueError, match="requires y to be passed"):
        clone(calibrator).fit(z, None)
    # Sample weights (check_sample_weights_shape, _not_overwritten, _equivalence).
    weights = np.random.default_rng(2).integers(0, 4, z.shape[0]).astype(np.float64)
    kept = weights.copy()
    weighted = clone(calibrator).fit(z, y, sample_weight=weights)
    np.testing.assert_array_equal(weights, kept)
    for bad in (weights[:-1], np.column_stack([weights, weights])):
        with pytest.raises(ValueError):
            clone(calibrator).fit(z, y, sample_weight=bad)
    if name not in NOT_WEIGHT_AS_REPEAT:
        # The default floor of step methods, 1/(2(n+1)), counts rows: pinned to 0 here.
        unfloored = {"min_probability": 0.0} if "min_probability" in params else {}
        weighted = clone(calibrator).set_params(**unfloored).fit(z, y, sample_weight=weights)
        repeated = clone(calibrator).set_params(**unfloored).fit(np.repeat(z, weights.astype(int)), np.repeat(y, weights.astype(int)))
        np.testing.assert_allclose(weighted.predict(z), repeated.predict(z), rtol=1e-7, atol=1e-9)


def test_service_messages_are_unchanged_for_its_own_entry_points():
    """The API's entry points keep their messages (and pointers); (n, 1) is the sklearn face's."""
    calibrator = METHODS["platt"](input="probability")
    with pytest.raises(CalibrationInputError, match="must be a flat list"):
        calibrator.check_holdout_arrays([[0.1]] * 20, [0, 1] * 10)
    calibrator.fit(np.linspace(0.05, 0.95, 20)[:, None], [0, 1] * 10)
    with pytest.raises(CalibrationInputError, match="must be a flat list"):
        calibrator.predict_details([[0.1], [0.2]])
