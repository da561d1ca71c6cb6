"""The anytime-valid drift test: validity, power, persistence and input checks.

The simulations follow the issue at a smaller size (300 streams instead of
2,000; the same 24 batches of 2,000 labels at a 5% base rate); the full size
is ``benchmarks/monitor_sim.py``. Each rate is asserted through a one-sided
95% Clopper-Pearson bound, so that passing here means the issue's bound holds
at that confidence, not merely that a point estimate fell on the right side:

* false alarms: upper bound <= alpha = 0.05, i.e. at most 9 alarms out of 300
  (the benchmark measures about 0.5%, an expected 1.5 alarms here);
* power: lower bound >= 0.99, which needs all 300 streams to alarm (0.05^(1/300)
  = 0.990); 14 or more drifted batches with a typical delay of 2 make a miss
  vanishingly rare;
* median delay <= 2 batches: the lower bound on P(delay <= 2) exceeds 1/2
  (the benchmark measures about 0.9).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import expit, logit
from scipy.stats import beta

from calibd.inputs import CalibrationInputError
from calibd.monitoring import DriftResult, DriftTest, ParallelDriftTests

ALPHA = 0.05
N_STREAMS, N_BATCHES, N_LABELS, CHANGE = 300, 24, 2000, 8


def mean_logit_for_rate(rate: float, spread: float = 1.0) -> float:
    """mu with E[sigmoid(mu + spread * Z)] = rate, Z standard normal (Gauss-Hermite)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    return brentq(lambda mu: weights @ expit(mu + spread * nodes) - rate, -20.0, 20.0)


MU = mean_logit_for_rate(0.05)  # about -3.37: the mean prediction is 5%


def simulate(tests, true_logit, n_streams=N_STREAMS, n_batches=N_BATCHES, n_labels=N_LABELS, seed=0, mu=MU):
    """Feed the same simulated streams to each ParallelDriftTests; returns the last results.

    Predictions are p = sigmoid(z), z ~ N(mu, 1); labels are drawn from
    sigmoid(true_logit(batch, z)).
    """
    rng = np.random.default_rng(seed)
    results = [None] * len(tests)
    for batch in range(n_batches):
        z = rng.normal(mu, 1.0, (n_streams, n_labels))
        y = (rng.random(z.shape) < expit(true_logit(batch, z))).astype(np.float64)
        results = [test.update(expit(z), y) for test in tests]
    return results


def upper_bound(successes: int, trials: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper confidence bound on a binomial rate."""
    return 1.0 if successes == trials else float(beta.ppf(level, successes + 1, trials - successes))


def lower_bound(successes: int, trials: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower confidence bound on a binomial rate."""
    return 0.0 if successes == 0 else float(beta.ppf(1.0 - level, successes, trials - successes + 1))


def calibrated(batch, z):
    return z


# -- the e-process property -------------------------------------------------


@pytest.mark.parametrize(
    "tolerance, true_shift",
    [
        (0.0, None),  # exact calibration: M_t is a martingale, E[M_t] = 1
        (0.2, "edges"),  # truth on the band's edges, +-0.2 at random: the least favourable null
        (0.2, 0.2),  # truth on one edge
    ],
)
def test_mean_evalue_stays_at_most_one_under_the_null(tolerance, true_shift):
    # Small batches, a high base rate and a short restart scale, so that the
    # experts rather than the not-yet-started prior mass carry M_t, and a
    # look-ahead or projection bug shows (a plug-in fitted on the current
    # batch pushes the mean to about 1.5 by the second batch and 20 by the eighth).
    rng = np.random.default_rng(11)
    n_streams, n_labels = 4000, 50
    test = ParallelDriftTests(n_streams, alpha=ALPHA, tolerance=tolerance, restart_scale=50)
    mu = logit(0.3)
    for batch in range(1, 13):
        z = rng.normal(mu, 1.0, (n_streams, n_labels))
        if true_shift == "edges":
            shift = rng.choice([-tolerance, tolerance], size=z.shape)
        else:
            shift = true_shift or 0.0
        y = (rng.random(z.shape) < expit(z + shift)).astype(np.float64)
        evalue = np.exp(test.update(expit(z), y).log_evalue)
        if batch in (1, 2, 4, 8, 12):
            # E[M_t] <= 1; allow three standard errors of the Monte Carlo mean.
            standard_error = evalue.std(ddof=1) / math.sqrt(n_streams)
            assert evalue.mean() <= 1.0 + 3.0 * standard_error + 1e-12, (batch, evalue.mean(), standard_error)


def test_mean_evalue_grows_when_the_truth_leaves_the_band():
    # The check above has teeth: the same streams with a shift of 0.2 and no tolerance.
    rng = np.random.default_rng(11)
    test = ParallelDriftTests(4000, tolerance=0.0, restart_scale=50)
    for _ in range(12):
        z = rng.normal(logit(0.3), 1.0, (4000, 50))
        result = test.update(expit(z), (rng.random(z.shape) < expit(z + 0.2)).astype(np.float64))
    assert np.exp(result.log_evalue).mean() > 10.0


# -- the drift simulation, at a smaller size ---------------------------


@pytest.mark.slow
def test_no_drift_false_alarm_rate_is_at_most_alpha():
    (result,) = simulate([ParallelDriftTests(N_STREAMS, alpha=ALPHA)], calibrated, seed=1)
    alarms = int(result.alarm.sum())
    assert upper_bound(alarms, N_STREAMS) <= ALPHA, alarms


@pytest.mark.slow
def test_logit_shift_is_detected_within_two_batches():
    def shifted(batch, z):
        return z + 0.4 if batch >= CHANGE else z

    (result,) = simulate([ParallelDriftTests(N_STREAMS, alpha=ALPHA)], shifted, seed=2)
    assert lower_bound(int(result.alarm.sum()), N_STREAMS) >= 0.99
    # Delay d: the alarm came with the d-th drifted batch (1 = the first one).
    after = result.alarm_batch > CHANGE
    delay = result.alarm_batch[after] - CHANGE
    assert np.median(delay) <= 2
    assert lower_bound(int((delay <= 2).sum()), int(after.sum())) > 0.5


@pytest.mark.slow
def test_drift_within_the_tolerance_does_not_alarm():
    # A constant logit shift of 0.15 from the start: inside a tolerance of 0.2,
    # outside a tolerance of 0. The same streams feed both tests.
    def shifted(batch, z):
        return z + 0.15

    within, exact = simulate(
        [ParallelDriftTests(N_STREAMS, tolerance=0.2), ParallelDriftTests(N_STREAMS, tolerance=0.0)], shifted, seed=3
    )
    assert upper_bound(int(within.alarm.sum()), N_STREAMS) <= ALPHA, int(within.alarm.sum())
    assert exact.alarm.mean() >= 0.99


# -- one stream and many streams agree ------------------------------------------


@pytest.mark.parametrize("tolerance", [0.0, 0.1])
def test_parallel_tests_equal_single_tests_bit_for_bit(tolerance):
    rng = np.random.default_rng(5)
    n_streams = 4
    parallel = ParallelDriftTests(n_streams, tolerance=tolerance)
    singles = [DriftTest(tolerance=tolerance) for _ in range(n_streams)]
    for batch in range(10):
        n = int(rng.integers(1, 400))
        z = rng.normal(-2.0, 1.5, (n_streams, n))
        y = (rng.random(z.shape) < expit(z + (0.6 if batch >= 4 else 0.0))).astype(float)
        together = parallel.update(expit(z), y)
        for j, single in enumerate(singles):
            alone = single.update(expit(z[j]), y[j])
            assert alone.log_evalue == together.log_evalue[j]
            assert alone.alarm == together.alarm[j]
            assert (alone.alarm_batch or 0) == together.alarm_batch[j]


# -- state, latching, reset ------------------------------------------------------


def batches(n_batches, shift_from=None, shift=0.5, n=500, seed=7):
    rng = np.random.default_rng(seed)
    for batch in range(n_batches):
        z = rng.normal(-1.5, 1.0, n)
        drift = shift if shift_from is not None and batch >= shift_from else 0.0
        yield expit(z), (rng.random(n) < expit(z + drift)).astype(int)


@pytest.mark.parametrize("cut", [0, 3, 9])
def test_state_round_trip_through_json_gives_identical_results(cut):
    stream = list(batches(16, shift_from=6))
    reference = DriftTest(alpha=0.01, tolerance=0.1, restart_scale=800)
    expected = [reference.update(p, y) for p, y in stream]

    first = DriftTest(alpha=0.01, tolerance=0.1, restart_scale=800)
    for p, y in stream[:cut]:
        first.update(p, y)
    stored = json.dumps(first.to_dict(), allow_nan=False)  # plain JSON, as a database column
    resumed = DriftTest.from_dict(json.loads(stored))
    assert resumed.result() == first.result()
    assert [resumed.update(p, y) for p, y in stream[cut:]] == expected[cut:]
    # The alarm fires with batch 9: the cuts fall before and after it.
    assert [r.alarm_batch for r in expected[8:]] == [9] * 8 and not expected[7].alarm


def test_alarm_latches_until_reset():
    test = DriftTest(alpha=0.05)
    result = None
    for p, y in batches(12, shift_from=0, shift=0.8):
        result = test.update(p, y)
        if result.alarm:
            break
    assert result.alarm and result.alarm_batch == result.n_batches
    fired_at = result.alarm_batch
    # Plenty of calibrated feedback pulls the e-value back under the threshold ...
    for p, y in batches(40, seed=8, n=2000):
        result = test.update(p, y)
    assert result.log_evalue < result.log_threshold
    # ... but the alarm stays, with the batch that raised it.
    assert result.alarm and result.alarm_batch == fired_at
    assert test.to_dict()["state"]["alarm"] is True

    test.reset()
    fresh = DriftTest(alpha=0.05)
    assert test.result() == fresh.result()
    assert test.result().alarm is False and test.result().n_batches == 0
    for p, y in batches(5):
        assert test.update(p, y) == fresh.update(p, y)


def test_result_reports_counts_threshold_and_direction():
    test = DriftTest(alpha=0.05)
    assert test.result() == DriftResult(False, 0.0, math.log(20.0), 0, 0, None, None)
    for p, y in batches(6, shift_from=0, shift=-0.8):
        result = test.update(p, y)
    assert result.n_batches == 6 and result.n_samples == 3000
    assert result.log_threshold == pytest.approx(math.log(20.0))
    assert result.alarm and result.top_alternative.startswith("shift-")
    assert json.loads(json.dumps(result.to_dict())) == result.to_dict()


def test_single_labels_and_boolean_labels_are_accepted():
    test = DriftTest()
    assert not test.update([0.3], [True]).alarm
    assert test.update(np.array([0.0, 1.0]), np.array([False, True])).n_samples == 3
    # Extreme predictions contradicted by their labels give a finite e-value.
    assert math.isfinite(test.update([0.0, 1.0], [1, 0]).log_evalue)


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "probabilities, labels, field, index",
    [
        ([0.2, float("nan"), 0.4], [0, 1, 0], "probabilities", (1,)),
        ([0.2, float("inf")], [0, 1], "probabilities", (1,)),
        ([0.2, 1.2], [0, 1], "probabilities", (1,)),
        ([-0.1, 0.5], [0, 1], "probabilities", (0,)),
        ([0.2, 0.5], [0, 2], "labels", (1,)),
        ([0.2, 0.5], [0.5, 1], "labels", (0,)),
        ([0.2, 0.5], [0, 1, 1], "labels", None),
        ([], [], "probabilities", None),
        (["a", "b"], [0, 1], "probabilities", None),
        ([[0.2, 0.5]], [[0, 1]], "probabilities", None),
        ([0.2, 0.5], [0, float("nan")], "labels", (1,)),
    ],
)
def test_bad_batches_raise_calibration_input_errors(probabilities, labels, field, index):
    test = DriftTest()
    with pytest.raises(CalibrationInputError) as error:
        test.update(probabilities, labels)
    assert error.value.field == field
    assert error.value.index == index
    assert test.result().n_batches == 0  # nothing was consumed


def test_parallel_tests_check_their_shape():
    with pytest.raises(CalibrationInputError) as error:
        ParallelDriftTests(3).update(np.full((2, 5), 0.5), np.zeros((2, 5)))
    assert error.value.field == "probabilities"
    with pytest.raises(CalibrationInputError):
        ParallelDriftTests(2).update(np.full((2, 5), 0.5), np.zeros((2, 4)))


@pytest.mark.parametrize(
    "params, field",
    [
        ({"alpha": 0.0}, "options.alpha"),
        ({"alpha": 1.0}, "options.alpha"),
        ({"alpha": True}, "options.alpha"),
        ({"tolerance": -0.1}, "options.tolerance"),
        ({"tolerance": float("nan")}, "options.tolerance"),
        ({"restart_scale": 0}, "options.restart_scale"),
    ],
)
def test_bad_parameters_are_rejected(params, field):
    with pytest.raises(CalibrationInputError) as error:
        DriftTest(**params)
    assert error.value.field == field


def test_from_dict_rejects_foreign_or_damaged_state():
    state = DriftTest().to_dict()
    with pytest.raises(ValueError):
        DriftTest.from_dict({"kind": "platt"})
    with pytest.raises(ValueError):
        DriftTest.from_dict({**state, "version": 99})
    test = DriftTest()
    for p, y in batches(2):
        test.update(p, y)
    damaged = test.to_dict()
    damaged["state"]["log_s"] = damaged["state"]["log_s"][:-1]
    with pytest.raises(ValueError):
        DriftTest.from_dict(damaged)
    damaged = test.to_dict()
    damaged["params"]["alpha"] = 2.0
    with pytest.raises(ValueError):
        DriftTest.from_dict(damaged)
