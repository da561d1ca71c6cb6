"""The compiled kernels (app/calibration/_kernels.c) against the numpy paths they stand in for.

The isotonic lookup must be np.interp bit for bit. The softmax must be the same
arithmetic as numpy's with the C library's exp: bit for bit against an
independent numpy form that takes ``math.exp`` per element, and within a few
ulps of the numpy path, whose vectorised exp differs in the last bit. Whatever
a kernel does not take (ints, booleans, NaN, ragged rows, other dtypes) it
declines, and the numpy path answers, errors included.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from calibd.calibration import kernels
from calibd.calibration.base import Calibrator
from calibd.inputs import CalibrationInputError
from calibd.calibration.isotonic import IsotonicCalibrator, _Interpolator
from calibd.calibration.temperature import TemperatureCalibrator, _softmax_in_place

# Skipped only when turned off on purpose: a build that failed quietly fails here instead.
pytestmark = pytest.mark.skipif(os.environ.get("CALIBD_KERNELS") == "0", reason="the kernels are off (CALIBD_KERNELS=0)")


def test_the_kernels_are_built_where_the_tests_run():
    assert kernels.available(), "app/calibration/_kernels.c was not built: is there a C compiler? (make clean test)"


def _thresholds(rng, kind):
    if kind == "fitted":
        scores = rng.random(int(rng.integers(200, 50_000)))
        labels = (rng.random(scores.shape[0]) < scores**1.3).astype(int)
        model = IsotonicCalibrator().fit(np.round(scores, int(rng.integers(2, 6))) if rng.random() < 0.3 else scores, labels)
        return model.x_thresholds_, model.y_thresholds_
    if kind == "few":
        k = int(rng.integers(2, 8))
    else:
        k = int(rng.integers(50, 3000))
    if kind == "clustered":  # most thresholds in a few cells of the grid
        x = np.sort(np.concatenate([rng.normal(0.0, 1e-9, k), rng.normal(1e6, 1.0, 5)]))
    else:
        x = np.sort(rng.normal(0.0, 5.0, k))
    x = np.unique(x)
    y = np.sort(rng.random(x.shape[0]))
    return x, y


def _answers_as_the_full_checks(model, scores, maxulp: int) -> None:
    """What the kernel declined, predict_details answers as the base class's full checks do: the
    same error, or the same probabilities (within ``maxulp``: numpy's exp against the C library's)."""
    try:
        expected = Calibrator.predict_details(model, scores)
    except CalibrationInputError as error:
        with pytest.raises(CalibrationInputError) as raised:
            model.predict_details(scores)
        assert (raised.value.field, raised.value.index, raised.value.detail) == (error.field, error.index, error.detail)
    else:
        np.testing.assert_array_max_ulp(model.predict_details(scores)[0], expected[0], maxulp=maxulp)


@pytest.mark.parametrize("kind", ["fitted", "few", "spread", "clustered"])
@pytest.mark.parametrize("seed", range(6))
def test_isotonic_lookup_is_np_interp_bit_for_bit(kind, seed):
    rng = np.random.default_rng(seed)
    x, y = _thresholds(rng, kind)
    lookup = _Interpolator(x, y).kernel  # as the calibrator builds it
    assert lookup is not None
    queries = np.concatenate([
        rng.uniform(x[0] - 1.0, x[-1] + 1.0, 5000), rng.choice(x, 500),
        x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf), [x[0] - 1e300, x[-1] + 1e300, -0.0, 0.0],
    ])
    expected = np.interp(queries, x, y)
    np.testing.assert_array_equal(lookup(queries), expected)
    np.testing.assert_array_equal(lookup(queries.tolist()), expected)
    np.testing.assert_array_equal(lookup(queries[:1].tolist()), expected[:1])


def test_isotonic_lookup_is_not_built_for_slopes_that_overflow_or_one_threshold():
    x = np.array([0.0, 5e-324, 1.0])  # subnormal-close knots: a slope overflows
    y = np.array([0.0, 0.5, 1.0])
    assert _Interpolator(x, y).kernel is None
    assert _Interpolator(x[:1], y[:1]).kernel is None
    # The calibrator then keeps numpy's path, with its repair of such knots.
    model = IsotonicCalibrator(input="logit")
    model.x_thresholds_, model.y_thresholds_, model.n_classes_ = x, y, 2
    assert model.predict_compiled([0.5]) is None
    np.testing.assert_array_equal(model.predict(np.array([0.5, 2.0])), [0.75, 1.0])


@pytest.mark.parametrize("bad", [
    [0.5, 1], [0.5, True], [0.5, None], [0.5, [0.5]], [0.5, "0.5"], [0.5, math.nan], [0.5, math.inf], [0.5, 1.5],
    [-0.25, 0.5], [], np.array([[0.5, 0.5]]), np.array([1, 0]), np.array([True, False]), (0.5, 0.25),
    np.array([0.5, np.nan]), np.array([0.5, 1.5], dtype=np.float32),
])
def test_isotonic_kernel_declines_what_is_not_plain_valid_probabilities(bad):
    rng = np.random.default_rng(0)
    scores = rng.random(2000)
    model = IsotonicCalibrator().fit(scores, (rng.random(2000) < scores).astype(int))
    assert model.predict_compiled(bad) is None
    _answers_as_the_full_checks(model, bad, maxulp=0)


def test_isotonic_kernel_takes_any_finite_logit():
    rng = np.random.default_rng(3)
    scores = rng.normal(0, 3, 5000)
    model = IsotonicCalibrator(input="logit").fit(scores, (rng.random(5000) < 1 / (1 + np.exp(-scores))).astype(int))
    queries = [-1e308, -40.0, 0.0, 3.5, 1e308]
    np.testing.assert_array_equal(model.predict_compiled(queries), np.interp(queries, model.x_thresholds_, model.y_thresholds_))
    for bad in ([0.0, math.inf], [0.0, -math.inf], [0.0, math.nan]):
        assert model.predict_compiled(bad) is None


def _softmax_with_libm_exp(z: np.ndarray, t: float) -> np.ndarray:
    """temperature.py's softmax with math.exp (the C library's) in place of numpy's exp:
    rows with every |z / T| < 600 unshifted, others shifted by their maximum; numpy's sums."""
    w = z / t
    far = ~(np.abs(w).max(axis=1) < 600.0)
    shifted = np.where(far[:, None], w - w.max(axis=1, keepdims=True), w)
    e = np.array([[math.exp(v) for v in row] for row in shifted])
    return e / np.add.reduce(e, axis=1, keepdims=True)


def _temperature(k: int, t: float) -> TemperatureCalibrator:
    model = TemperatureCalibrator(input="logit")
    model.temperature_, model.n_classes_ = t, k
    return model


@pytest.mark.parametrize("k", [2, 3, 10, 64, 65, 200, 1000])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0, 1000.0])
def test_softmax_is_numpys_arithmetic_with_the_c_librarys_exp(k, scale):
    rng = np.random.default_rng(k)
    z = rng.normal(0, scale, (60, k)) + rng.normal(0, scale, (60, 1))
    t = 1.7
    expected = _softmax_with_libm_exp(z, t)
    got = kernels.softmax(z, t, k)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(kernels.softmax(z.tolist(), t, k), expected)
    # Within a few ulps of the numpy path, whose vectorised exp rounds differently.
    np.testing.assert_array_max_ulp(got, _softmax_in_place(z / t), maxulp=8)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_a_rows_softmax_does_not_depend_on_its_batch():
    rng = np.random.default_rng(4)
    z = rng.normal(0, 3, (50, 10))
    far = np.r_[z, [[1e5] + [0.0] * 9]]  # a row beyond the unshifted range joins the batch
    np.testing.assert_array_equal(kernels.softmax(far, 1.3, 10)[:50], kernels.softmax(z, 1.3, 10))
    for i in (0, 17, 49):
        np.testing.assert_array_equal(kernels.softmax(z[i:i + 1], 1.3, 10)[0], kernels.softmax(z, 1.3, 10)[i])


@pytest.mark.parametrize("bad", [
    [[0.5, 1.0, 2.0], [0.5, 1]], [[0.5, 1.0, 2.0], [0.5, True, 2.0]], [[0.5, 1.0, 2.0], [0.5, 1.0]],
    [[0.5, 1.0, 2.0], [0.5, 1.0, 2.0, 3.0]], [[0.5, 1.0, math.nan]], [[0.5, 1.0, math.inf]], [[0.5, -math.inf, 1.0]],
    [[0.5, 1.0, None]], [[0.5, 1.0, [2.0]]], [0.5, 1.0, 2.0], [], [[]], ([0.5, 1.0, 2.0],),
    np.ones((4, 2)), np.ones(3), np.ones((4, 3), dtype=int), np.full((2, 3), np.nan), np.ones((0, 3)),
])
def test_softmax_kernel_declines_what_is_not_rows_of_finite_floats(bad):
    model = _temperature(3, 1.5)
    assert model.predict_compiled(bad) is None
    _answers_as_the_full_checks(model, bad, maxulp=8)


def test_every_temperature_path_gives_the_kernels_bits():
    rng = np.random.default_rng(6)
    z = rng.normal(0, 2, (300, 5))
    model = TemperatureCalibrator(input="logit").fit(z, rng.integers(0, 5, 300))
    served = model.predict_details(z.tolist())[0]
    np.testing.assert_array_equal(model.predict(z), served)  # the checked path
    np.testing.assert_array_equal(model.predict(np.asfortranarray(z)), served)  # not C-contiguous
    np.testing.assert_array_equal(model.predict_proba(z), served)


def _layouts(array: np.ndarray) -> list[np.ndarray]:
    """The same values as a strided view, a Fortran-ordered copy, a tensor's bytes at an odd offset
    (an unaligned array, which numpy will not lend as a buffer) and float32 (the values are exact)."""
    wide = np.zeros((array.shape[0], *array.shape[1:-1], 2 * array.shape[-1]) if array.ndim == 2 else 2 * array.shape[0])
    view = wide[..., ::2]
    view[...] = array
    raw = b"x" + array.tobytes()
    unaligned = np.frombuffer(memoryview(raw)[1:], "<f8").reshape(array.shape)
    assert not unaligned.flags.aligned
    assert np.array_equal(array.astype(np.float32), array)
    return [view, np.asfortranarray(array), unaligned, array.astype(np.float32)]


def test_the_kernels_take_float_arrays_in_any_layout_with_the_same_bits():
    rng = np.random.default_rng(8)
    scores = rng.random(2000)
    model = IsotonicCalibrator().fit(scores, (rng.random(2000) < scores).astype(int))
    queries = np.round(rng.random(700) * 1024) / 1024  # float32-exact
    for variant in _layouts(queries):
        np.testing.assert_array_equal(model.predict_compiled(variant), model.predict_compiled(queries))
    temperature = _temperature(3, 1.4)
    logits = np.round(rng.normal(0, 3, (300, 3)) * 64) / 64
    for variant in _layouts(logits):
        np.testing.assert_array_equal(temperature.predict_compiled(variant), temperature.predict_compiled(logits))
        np.testing.assert_array_equal(temperature.predict_details(variant)[0], temperature.predict_compiled(logits))


_NUMPY_PATH = """
import json, sys
import numpy as np
from calibd.calibration import kernels
from calibd.calibration.isotonic import IsotonicCalibrator
from calibd.calibration.temperature import TemperatureCalibrator
case = json.load(sys.stdin)
iso = IsotonicCalibrator()
iso.x_thresholds_, iso.y_thresholds_, iso.n_classes_ = np.array(case["x"]), np.array(case["y"]), 2
temp = TemperatureCalibrator(input="logit")
temp.temperature_, temp.n_classes_ = case["t"], 4
print(json.dumps({
    "available": kernels.available(),
    "isotonic": iso.predict_details(case["scores"])[0].tolist(),
    "temperature": temp.predict_details(case["logits"])[0].tolist(),
}))
"""


def test_calibd_kernels_0_serves_numpys_path_with_the_same_answers():
    rng = np.random.default_rng(7)
    scores = rng.random(5000)
    model = IsotonicCalibrator().fit(scores, (rng.random(5000) < scores).astype(int))
    case = {
        "x": model.x_thresholds_.tolist(), "y": model.y_thresholds_.tolist(), "t": 1.9,
        "scores": rng.random(3000).tolist(), "logits": rng.normal(0, 3, (500, 4)).tolist(),
    }
    environment = dict(os.environ, CALIBD_KERNELS="0")
    answer = subprocess.run([sys.executable, "-c", _NUMPY_PATH], input=json.dumps(case), capture_output=True, text=True,
                            env=environment, check=True, timeout=120)
    numpy_path = json.loads(answer.stdout)
    assert numpy_path["available"] is False
    np.testing.assert_array_equal(numpy_path["isotonic"], model.predict_compiled(case["scores"]))
    temperature = _temperature(4, 1.9)
    np.testing.assert_array_max_ulp(np.array(numpy_path["temperature"]), temperature.predict_compiled(case["logits"]), maxulp=8)
