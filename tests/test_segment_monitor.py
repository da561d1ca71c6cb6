"""Per-segment monitors, the pure core: first come first tracked, and the split of alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibd.calibration import CalibrationInputError
from calibd.monitoring.drift import ParallelDriftTests
from calibd.monitoring.segments import OTHER, assign, check_declaration, check_rows, segment_alpha, next_alpha


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


def test_the_split_gives_out_alpha_over_every_segment_of_every_dimension():
    declared = {"dimensions": ["country", "device"], "max_values": 9}
    assert segment_alpha(0.05, 2, 9) == pytest.approx(0.05 / 20)
    spent = 0.0
    for _ in range(20):
        spent += next_alpha(0.05, declared, spent)
    assert spent == pytest.approx(0.05)
    assert next_alpha(0.05, declared, spent) == pytest.approx(0.0, abs=1e-15)


def test_no_sequence_of_declarations_gives_out_more_than_alpha():
    rng = np.random.default_rng(0)
    for _ in range(200):
        spent = 0.0
        for _ in range(rng.integers(1, 400)):
            declared = {"dimensions": ["d"] * int(rng.integers(1, 4)), "max_values": int(rng.integers(1, 30))}
            share = next_alpha(0.05, declared, spent)
            assert share >= 0.0
            spent += share
        assert spent <= 0.05 + 1e-15


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
