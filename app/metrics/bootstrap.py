"""Percentile bootstrap confidence intervals for any metric (Efron 1979; Efron & Tibshirani 1993, ch. 13).

Each resample draws n rows uniformly with replacement (a row keeps its
weight), the metric is recomputed on it, and the interval is the
(1 - level)/2 and (1 + level)/2 percentiles of the resampled values (numpy's
linear interpolation). Resamples on which the metric is undefined (NaN or
infinite, or only rows of weight 0 drawn) are left out; with fewer than two
left the interval is None.

The row indices for all resamples come from one ``numpy.random.Generator``
(PCG64) seeded with ``seed``, drawn in blocks of resamples at once: the same
seed gives the same resamples for every metric, so intervals of different
metrics on one request are paired. Each metric is vectorised over the rows;
the loop is over resamples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .inputs import Prepared, input_error, prepare

DEFAULT_RESAMPLES = 1000
MAX_RESAMPLES = 100_000
_BLOCK_ELEMENTS = 1 << 22  # indices drawn at once


def check_bootstrap(n_resamples: Any, seed: Any, level: Any, field: str = "options.bootstrap") -> tuple[int, int, float]:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or not 1 <= n_resamples <= MAX_RESAMPLES:
        raise input_error(f"{field}.n_resamples", f"must be an integer from 1 to {MAX_RESAMPLES}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise input_error(f"{field}.seed", "must be a non-negative integer")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise input_error(f"{field}.level", "must be a number strictly between 0 and 1")
    return int(n_resamples), int(seed), float(level)


def resample_indices(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """The row indices of each resample, drawn in blocks from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    block = max(1, min(n_resamples, _BLOCK_ELEMENTS // max(n, 1)))
    done = 0
    while done < n_resamples:
        count = min(block, n_resamples - done)
        yield from rng.integers(0, n, size=(count, n))
        done += count


def resample_values(
    statistic: Callable[[Prepared], float], data: Prepared, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """The statistic on each of ``n_resamples`` bootstrap resamples of ``data``."""
    values = np.empty(n_resamples)
    for r, rows in enumerate(resample_indices(data.n, n_resamples, seed)):
        sample = data.take(rows)
        values[r] = statistic(sample) if has_weight(sample) else np.nan
    return values


def has_weight(sample: Prepared) -> bool:
    """False for a resample that drew only rows of weight 0: every metric is undefined on it."""
    return sample.w is None or bool(sample.w.sum() > 0)


def percentile_interval(values: np.ndarray, level: float) -> list[float] | None:
    finite = values[np.isfinite(values)]
    if finite.shape[0] < 2:
        return None
    low, high = np.percentile(finite, [50.0 * (1.0 - level), 50.0 * (1.0 + level)])
    return [float(low), float(high)]


def bootstrap_ci(
    metric: Callable[..., float],
    probabilities,
    labels,
    sample_weight=None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    **metric_options: Any,
) -> list[float] | None:
    """Percentile interval ``[low, high]`` of ``metric(probabilities, labels, sample_weight=..., **metric_options)``.

    ``metric`` is any public metric of this package (``ece``, ``brier``, ...);
    a metric returning a tuple is reduced to its first element.

        >>> bootstrap_ci(ece, p, y, n_resamples=1000, seed=0, level=0.95, n_bins=10)
    """
    n_resamples, seed, level = check_bootstrap(n_resamples, seed, level, field="bootstrap")
    data = prepare(probabilities, labels, sample_weight)

    def statistic(sample: Prepared) -> float:
        value = metric(sample, None, sample_weight=None, **metric_options)
        return float(value[0] if isinstance(value, tuple) else value)

    return percentile_interval(resample_values(statistic, data, n_resamples, seed), level)
