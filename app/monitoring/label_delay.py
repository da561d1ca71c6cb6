"""Label timing: label windows, the delays of labels, and whether they depend on the label.

A label's delay is the time from its prediction to its arrival. calibd keeps
a small histogram of delays per label value (``DELAY_EDGES``: 0, then
log-spaced edges from 0.1 s to 90 days), from which it reads quantiles and
tests whether positives and negatives arrive with different delays.

Why it matters (Henzi & Ziegel, Biometrika 2022; Arnold, Henzi & Ziegel, AoAS
2023): a sequential test is valid when the order of its bets is fixed before
the outcomes are seen. When labels are fed in arrival order and positives
arrive sooner than negatives, the k-th label is not a draw with mean p_k, and
an e-process grows under a calibrated model. Declaring a label window and
feeding the monitors mature predictions in prediction-time order restores
the argument, whatever the delays inside the window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

#: The longest label window: 90 days.
MAX_WINDOW_SECONDS = 90 * 86400.0
#: The shortest: one second.
MIN_WINDOW_SECONDS = 1.0
MISSING = ("negative", "unlabelled")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")

#: Histogram edges in seconds: [0, 0.1), then 48 log-spaced bins up to 90 days, then one open bin.
DELAY_EDGES = np.concatenate([[0.0], np.geomspace(0.1, MAX_WINDOW_SECONDS, 49)])
N_DELAY_BINS = DELAY_EDGES.shape[0]  # the last bin holds delays beyond 90 days


def parse_window(value: str | int | float | None) -> float | None:
    """A label window in seconds: ``"30s"``, ``"15m"``, ``"6h"``, ``"7d"``, or a number of seconds;
    None means labels are final on arrival. Raises ValueError outside 1 s .. 90 days."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a duration such as \"30s\", \"6h\" or \"7d\", or null")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise ValueError("a duration such as \"30s\", \"6h\" or \"7d\" (s, m, h or d), or null")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not MIN_WINDOW_SECONDS <= seconds <= MAX_WINDOW_SECONDS:
        raise ValueError("must be between 1 second and 90 days")
    return seconds


def format_window(seconds: float | None) -> str | None:
    """The shortest exact spelling of a window: 604800 -> "7d", 90 -> "90s"."""
    if seconds is None:
        return None
    for unit in ("d", "h", "m"):
        count = seconds / _UNITS[unit]
        if count >= 1 and float(count).is_integer():
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


def delay_bins(delays_seconds: np.ndarray) -> np.ndarray:
    """The histogram bin of each delay (negative delays, clocks apart, count as 0)."""
    return np.searchsorted(DELAY_EDGES, np.maximum(delays_seconds, 0.0), side="right") - 1


def delay_counts(delays_seconds: np.ndarray, labels: np.ndarray) -> dict[int, np.ndarray]:
    """Counts per bin for each label value present."""
    bins = delay_bins(np.asarray(delays_seconds, dtype=np.float64))
    labels = np.asarray(labels)
    return {int(value): np.bincount(bins[labels == value], minlength=N_DELAY_BINS) for value in np.unique(labels)}


def quantile(counts: np.ndarray, q: float) -> float | None:
    """The q-quantile of a delay histogram, linear within its bin (log-linear above 0.1 s)."""
    total = counts.sum()
    if total == 0:
        return None
    cumulative = np.cumsum(counts)
    target = q * total
    b = int(np.searchsorted(cumulative, target, side="left"))
    below = cumulative[b - 1] if b else 0
    inside = (target - below) / counts[b] if counts[b] else 0.0
    lower = DELAY_EDGES[b]
    if b + 1 >= DELAY_EDGES.shape[0]:
        return float(lower)
    upper = DELAY_EDGES[b + 1]
    if lower <= 0.0:
        return float(lower + inside * (upper - lower))
    return float(lower * (upper / lower) ** inside)


@dataclass(frozen=True)
class DelayComparison:
    """Whether positives' and negatives' delays differ: the test and its effect size."""

    positives: int
    negatives: int
    p_value: float | None
    distance: float | None  # the largest gap between the two binned delay distributions (Kolmogorov)
    differ: bool


#: Conditions for "clearly different": enough labels of each value, a small p-value, and a large gap.
MIN_LABELS = 50
MAX_P_VALUE = 1e-3
MIN_DISTANCE = 0.2


def compare_delays(positive: np.ndarray, negative: np.ndarray) -> DelayComparison:
    """A chi-squared test of homogeneity of the two delay histograms, with an effect-size floor.

    The test alone flags tiny gaps on millions of labels; the Kolmogorov distance
    between the binned distributions (at least ``MIN_DISTANCE``) keeps the
    diagnostic for delays that differ enough to bias the monitors.
    """
    n_pos, n_neg = int(positive.sum()), int(negative.sum())
    if n_pos < MIN_LABELS or n_neg < MIN_LABELS:
        return DelayComparison(n_pos, n_neg, None, None, False)
    used = (positive + negative) > 0
    table = np.vstack([positive[used], negative[used]])
    distance = float(np.max(np.abs(np.cumsum(positive) / n_pos - np.cumsum(negative) / n_neg)))
    if table.shape[1] < 2:
        return DelayComparison(n_pos, n_neg, 1.0, distance, False)
    from scipy import stats  # here: scipy.stats is slow to import, and the server needs it only for this

    p_value = float(stats.chi2_contingency(table, correction=False)[1])
    return DelayComparison(n_pos, n_neg, p_value, distance, p_value < MAX_P_VALUE and distance >= MIN_DISTANCE)


class LabelSettingsError(ValueError):
    """A wrong label setting: ``field`` is ``window``, ``missing`` or ``""`` (the whole object)."""

    def __init__(self, field: str, detail: str):
        self.field = field
        self.detail = detail
        super().__init__(f"{field or 'labels'}: {detail}")


def parse_labels(value: object) -> tuple[float | None, str]:
    """``{"window": "7d", "missing": "negative"}`` (or None: final on arrival) as (seconds or None, missing)."""
    if value is None:
        return None, "negative"
    if not isinstance(value, dict):
        raise LabelSettingsError("", 'an object such as {"window": "7d", "missing": "negative"}')
    unknown = sorted(set(value) - {"window", "missing"})
    if unknown:
        raise LabelSettingsError(str(unknown[0]), "unknown field (labels take window and missing)")
    try:
        seconds = parse_window(value.get("window"))
    except ValueError as error:
        raise LabelSettingsError("window", str(error)) from None
    missing = value.get("missing", "negative")
    if missing not in MISSING:
        raise LabelSettingsError("missing", "negative or unlabelled")
    return seconds, missing
