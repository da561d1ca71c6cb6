"""Per-segment monitors, the pure core: first come first tracked, and the split of alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError
import json

from scipy.special import expit

from calibd.monitoring.drift import DriftTest, ParallelDriftTests
from calibd.monitoring.segment_drift import ParallelSegmentDriftTests, SegmentDriftTest, start_mass
from calibd.monitoring.segments import OTHER, assign, check_declaration, check_rows, segment_alpha


def column(*values):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def test_values_are_tracked_first_come_and_the_rest_pool_into_other():
    segments, new = assign(column("br", "us", None, "br", "fr", "de", "us"), [], 2)
    assert segments.tolist() == ["br", "us", None, "br", OTHER, OTHER, "us"]
    assert new == ["br", "us"]
    # Known values keep their segment; a new one takes the room left.
    segments, new = assign(column("fr", "br", "jp"), ["br"], 2)
    assert segments.tolist() == ["fr", "br", OTHER] and new == ["fr"]
    # A lowered cap keeps the first tracked; the later ones pool.
    segments, new = assign(column("br", "us", "fr"), ["br", "us", "fr"], 1)
    assert segments.tolist() == ["br", OTHER, OTHER] and new == []
    # A value spelled like the pooled segment is pooled, never tracked as a value of its own.
    segments, new = assign(column(OTHER, "x"), [], 5)
    assert segments.tolist() == [OTHER, "x"] and new == ["x"]


def test_declarations_are_checked_field_by_field():
    assert check_declaration({"dimensions": ["country", "device"]}) == {"dimensions": ["country", "device"], "max_values": 50}
    for bad, field, index in (
        ({"dimensions": []}, "segments.dimensions", None),
        ({"dimensions": ["a", "a"]}, "segments.dimensions", (1,)),
        ({"dimensions": ["a b"]}, "segments.dimensions", (0,)),
        ({"dimensions": ["a"], "max_values": 0}, "segments.max_values", None),
        ({"dimensions": ["a"], "max_values": 2.0}, "segments.max_values", None),
        ({"dimensions": ["a"], "cap": 2}, "segments.cap", None),
    ):
        with pytest.raises(CalibrationInputError) as caught:
            check_declaration(bad)
        assert (caught.value.field, caught.value.index) == (field, index), bad


def test_rows_must_be_declared_strings_of_the_right_length():
    declared = {"dimensions": ["country"], "max_values": 5}
    assert check_rows({"country": ["br", "us"]}, 2, declared)["country"].tolist() == ["br", "us"]
    for bad, n, field, index in (
        ({"device": ["a", "b"]}, 2, "segments.device", None),
        ({"country": ["a"]}, 2, "segments.country", None),
        ({"country": ["a", 3]}, 2, "segments.country", (1,)),
        ({"country": ["a", ""]}, 2, "segments.country", (1,)),
    ):
        with pytest.raises(CalibrationInputError) as caught:
            check_rows(bad, n, declared)
        assert (caught.value.field, caught.value.index) == (field, index), bad
    with pytest.raises(CalibrationInputError) as caught:
        check_rows({"country": ["a"]}, 1, None)
    assert caught.value.field == "segments"


def test_segment_tests_under_the_null_alarm_together_at_most_alpha():
    """The family-wise rate of 20 segment tests with alpha/20 each, on calibrated streams, stays under alpha."""
    n_streams, n_segments, alpha = 300, 20, 0.2
    rng = np.random.default_rng(7)
    tests = [ParallelDriftTests(n_streams, alpha=segment_alpha(alpha, 1, n_segments - 1), tolerance=0.0)
             for _ in range(n_segments)]
    for _ in range(10):
        for test in tests:
            p = rng.uniform(0.02, 0.6, (n_streams, 100))
            y = (rng.uniform(size=p.shape) < p).astype(np.int8)
            test.update(p, y)
    any_alarm = np.zeros(n_streams, dtype=bool)
    for test in tests:
        any_alarm |= test._state.alarm
    # alpha = 0.2 over 300 streams: the rate is bounded by 0.2; 0.2 + 3 sigma of a binomial at 0.2 = 0.27.
    assert any_alarm.mean() <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / n_streams)


def survival(n, scale=20_000.0):
    return (1.0 + n / scale) ** -0.5


def test_start_mass_follows_the_prior_and_never_gives_out_more_than_the_budget():
    rng = np.random.default_rng(3)
    given, seen = 0.0, 0
    for _ in range(2000):
        n = int(rng.integers(1, 50_000))
        w = start_mass(given, n)
        # The mass of labels seen + 1 .. seen + n under G, found from the mass given alone.
        assert w == pytest.approx(survival(seen) - survival(seen + n), rel=1e-6, abs=1e-15)
        given += w
        seen += n
        assert given <= 1.0
    assert start_mass(1.0, 100) == 0.0 and start_mass(0.3, 0) == 0.0


def null_edge_batch(rng, m, n, tolerance):
    """Predictions and labels drawn at the null's edge (true logit = prediction's + tolerance)."""
    p = rng.uniform(0.02, 0.5, (m, n))
    y = (rng.uniform(size=p.shape) < expit(np.log(p / (1 - p)) + tolerance)).astype(np.int8)
    return p, y


def test_family_wealth_is_a_supermartingale_at_the_null_edge():
    """E[R(t) + sum_j M_j(t)] <= 1 at every batch, where the null is tight (every segment at +tolerance)."""
    m, sizes, tolerance, scale = 4000, (60, 30, 10), 0.1, 300.0
    rng = np.random.default_rng(5)
    tests = [ParallelSegmentDriftTests(m, alpha=0.05, tolerance=tolerance) for _ in sizes]
    given, n = 0.0, sum(sizes)
    for _ in range(6):
        w = start_mass(given, n, scale)
        given += w
        wealth = np.full(m, 1.0 - given)
        for test, size in zip(tests, sizes):
            p, y = null_edge_batch(rng, m, size, tolerance)
            wealth += np.exp(test.update(p, y, w * size / n).log_evalue)
        # A nonnegative mean with a heavy right tail: bound it by its mean plus 3 standard errors.
        assert wealth.mean() - 3 * wealth.std() / np.sqrt(m) <= 1.0
    # And the bets are not idle: a segment shifted past the band grows its wealth.
    test = ParallelSegmentDriftTests(500, alpha=0.05, tolerance=tolerance)
    for _ in range(6):
        p, y = null_edge_batch(rng, 500, 200, 0.9)
        result = test.update(p, y, 0.01)
    assert np.median(result.log_evalue) > np.log(20)


def test_segment_tests_sharing_the_budget_alarm_together_at_most_alpha():
    """20 segments at the null's edge, alpha = 0.2: the share of streams where any segment alarms <= alpha."""
    m, alpha, tolerance, sizes = 400, 0.2, 0.1, [40] * 10 + [10] * 10
    rng = np.random.default_rng(9)
    tests = [ParallelSegmentDriftTests(m, alpha=alpha, tolerance=tolerance) for _ in sizes]
    given, n = 0.0, sum(sizes)
    for _ in range(10):
        w = start_mass(given, n, 2000.0)
        given += w
        for test, size in zip(tests, sizes):
            test.update(*null_edge_batch(rng, m, size, tolerance), w * size / n)
    any_alarm = np.any([t._state.alarm for t in tests], axis=0)
    assert any_alarm.mean() <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / m)


def test_segment_state_round_trips_through_json_and_an_older_state_is_told_apart():
    rng = np.random.default_rng(2)
    test = SegmentDriftTest(alpha=0.05, tolerance=0.1)
    twin = None
    for batch in range(5):
        p, y = null_edge_batch(rng, 1, 80, 0.8)
        if batch == 2:
            twin = SegmentDriftTest.from_dict(json.loads(json.dumps(test.to_dict())))
        result = test.update(p[0], y[0], 0.01 * (batch + 1))
        if twin is not None:
            assert twin.update(p[0], y[0], 0.01 * (batch + 1)) == result
    assert twin.mass == pytest.approx(0.15)
    old = DriftTest(alpha=0.01).to_dict()
    assert SegmentDriftTest.is_state(test.to_dict()) and not SegmentDriftTest.is_state(old)
    with pytest.raises(ValueError):
        SegmentDriftTest.from_dict(old)
