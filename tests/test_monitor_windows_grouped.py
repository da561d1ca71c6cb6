"""BinSums of many groups at once equal BinSums of each group alone (the /metrics read uses the former)."""

from __future__ import annotations

import numpy as np

from calibd.monitoring.windows import SUM_FIELDS, BinSums, feedback_terms


def test_of_groups_equals_of_each_group():
    rng = np.random.default_rng(0)
    n, n_groups = 5_000, 37
    p = rng.uniform(size=n)
    p[:10] = [0.0, 1.0, 1 / 15, 14 / 15, 0.5, 0.0, 1.0, 2 / 15, 0.999999, 1e-9]  # bin edges
    y = (rng.uniform(size=n) < p).astype(np.int64)
    groups = rng.integers(0, n_groups, n)
    together = BinSums.of_groups(p, y, groups, n_groups)
    for g in range(n_groups):
        rows = groups == g
        alone = BinSums.of(feedback_terms(p[rows], y[rows]))
        for name in SUM_FIELDS:
            np.testing.assert_allclose(getattr(together[g], name), getattr(alone, name), rtol=1e-12, atol=1e-12)


def test_from_group_rows_equals_from_rows():
    rng = np.random.default_rng(1)
    n, n_groups = 400, 9
    groups = rng.integers(0, n_groups, n)
    bins = rng.integers(0, 15, n)
    values = rng.uniform(size=(n, len(SUM_FIELDS)))
    together = BinSums.from_group_rows(groups, bins, values, n_groups)
    for g in range(n_groups):
        alone = BinSums.from_rows([(b, *v) for b, v in zip(bins[groups == g], values[groups == g])])
        for name in SUM_FIELDS:
            np.testing.assert_allclose(getattr(together[g], name), getattr(alone, name), rtol=1e-12)
