"""The monitor windows of many groups at once equal those of each group alone (the /metrics read
of every calibrator's current version uses the former)."""

from __future__ import annotations

import numpy as np

from calibd.monitoring.windows import (
    METRICS, SUM_FIELDS, BinSums, feedback_terms, group_sums, metrics_table, window_metrics,
)


def test_group_sums_equal_bin_sums_of_each_group():
    rng = np.random.default_rng(0)
    n, n_groups = 5_000, 37
    p = rng.uniform(size=n)
    p[:10] = [0.0, 1.0, 1 / 15, 14 / 15, 0.5, 0.0, 1.0, 2 / 15, 0.999999, 1e-9]  # bin edges
    y = (rng.uniform(size=n) < p).astype(np.int64)
    groups = rng.integers(0, n_groups - 1, n)  # the last group has no rows
    together = group_sums(p, y, groups, n_groups)
    assert together.shape == (n_groups, len(SUM_FIELDS), 15)
    for g in range(n_groups):
        rows = groups == g
        alone = BinSums.of(feedback_terms(p[rows], y[rows]))
        np.testing.assert_allclose(together[g], alone.table(), rtol=1e-12, atol=1e-12)
    assert not together[-1].any()


def test_metrics_table_equals_window_metrics_of_each_window():
    rng = np.random.default_rng(1)
    windows = []
    for k in range(12):
        p = rng.uniform(size=200)
        y = (rng.uniform(size=200) < p).astype(np.int64)
        accepted = None if k % 3 else rng.uniform(size=200) < 0.7
        windows.append(BinSums.of(feedback_terms(p, y, accepted)))
    windows.append(BinSums())  # an empty window: None everywhere but samples
    binary = np.array([k % 2 == 0 for k in range(len(windows))])
    table = metrics_table(np.stack([w.table() for w in windows]), binary)
    for k, sums in enumerate(windows):
        expected = window_metrics(sums, binary=bool(binary[k]))
        assert set(expected) == set(METRICS)
        for metric, value in expected.items():
            got = table[metric][k]
            if value is None:
                assert np.isnan(got), (k, metric, got)
            else:
                assert got == value or abs(got - value) <= 1e-12 * max(1.0, abs(value)), (k, metric, got, value)


def test_table_round_trip():
    sums = BinSums.of(feedback_terms(np.array([0.1, 0.5, 0.95]), np.array([0, 1, 1]), np.array([True, False, True])))
    again = BinSums.from_table(sums.table())
    for name in SUM_FIELDS:
        np.testing.assert_array_equal(getattr(again, name), getattr(sums, name))
