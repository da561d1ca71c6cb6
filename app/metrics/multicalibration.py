"""Multicalibration error: Tygert's ECCE per segment, and its maximum over segments (MCE).

ECCE, the estimated cumulative calibration error (Arrieta-Ibarra, Gujral,
Tannen, Tygert & Xu 2022, "Metrics of calibration for probabilistic
predictions", JMLR 23(351)), of predictions p with outcomes y and weights w
in a set of rows S, sorted by p:

    C_k   = sum_{i <= k, i in S} w_i (y_i - p_i) / W_S       (C_0 = 0, W_S = sum_{i in S} w_i)
    ECCE  = max_k C_k - min_k C_k
    sd    = sqrt(sum_{i in S} w_i^2 p_i (1 - p_i)) / W_S     (its scale under calibration)
    sigma = ECCE / sd                                         (inf if sd = 0 < ECCE; 0 if both are 0)

Under perfect calibration ECCE / sd tends to the range of a standard
Brownian motion on [0, 1] (Kuiper), whose CDF is

    F(x) = sum_{k >= 0} (8 / x^2 + 2 / (pi^2 (k + 1/2)^2)) exp(-2 (k + 1/2)^2 pi^2 / x^2),

so the p-value is 1 - F(sigma) (1 for sigma < 1e-20, machine epsilon for
sigma >= 8.26732673, where F is 1 in double precision).

The multicalibration error (Guy, Haimovich, Linder, Okati, Perini, Tax &
Tygert 2025, "Measuring multi-calibration", arXiv:2506.11251) takes ECCE over
segments: the whole set, then every value of every categorical column, every
pair of values of two columns, ... up to ``max_depth`` columns, keeping
segments of at least ``min_samples`` rows, at most ``max_segments`` of them:

    MCE_sigma = max over segments of sigma_S
    MCE       = MCE_sigma * sd_global                         (back on the probability scale)
    MCE_p     = min over segments of p_S                      (not adjusted for multiplicity)
    MDE_S     = 5 sd_S                                         (minimum detectable error, MCGrad's 5 sigma)

``worst`` ranks segments by sigma_S, the evidence of miscalibration, not by
ECCE_S: a 28-row segment's ECCE is large on noise alone, its sigma is not.

Segments are formed as MCGrad 0.1.5 (``mcgrad.metrics.MulticalibrationError``
with ``categorical_segment_columns``) forms them, and every number equals its
``precision_dtype="float64"`` values: a column with more than ``max_values``
distinct values keeps its ``max_values - 1`` most frequent ones (ties: the one
met first in score order) and pools the rest into ``"__OTHER"``; values are
enumerated in the order they are first met in score order, column subsets in
the order of the columns; segments past ``max_segments`` are dropped in MCGrad's
chunks of 50. One difference: MCGrad cumulates tied predictions one row at a
time in the order its sort leaves them, so its ECCE depends on that order when
predictions tie; here C is taken only at the ends of runs of equal p, as
``interval_calibration`` does (ECCE over all rows is exactly
``interval_calibration``), so the value is the same in any row order. Without
ties the two agree to rounding.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from typing import Any

import numpy as np

from .inputs import input_error

#: MCGrad 0.1.5's defaults (``mcgrad.metrics.DEFAULT_MCE_*``).
DEFAULT_MAX_DEPTH = 3
DEFAULT_MAX_VALUES = 3
DEFAULT_MIN_SAMPLES = 10
DEFAULT_MAX_SEGMENTS = 1000
#: The value infrequent categories are pooled into.
OTHER = "__OTHER"
#: MCGrad builds segments in chunks of this many and drops whole chunks past max_segments.
_CHUNK = 50
#: A segment's minimum detectable error is this many standard deviations of its ECCE under
#: calibration (MCGrad's ``mde``: 5 sigma); an error below it cannot be told from noise there.
MDE_SIGMAS = 5.0
#: ``worst`` lists this many segments, the strongest evidence of miscalibration first.
WORST_SEGMENTS = 10
SIGMA_MAX = 8.26732673
SIGMA_MIN = 1e-20


def ecce_cdf(x: np.ndarray) -> np.ndarray:
    """CDF of the range of a standard Brownian motion on [0, 1] at x > 0 (the series above, truncated
    where its terms fall below machine epsilon; 1 - eps from SIGMA_MAX on)."""
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    eps = sys.float_info.epsilon
    out = np.full_like(x, 1.0 - eps)
    todo = x < SIGMA_MAX
    if not todo.any():
        return out
    xc = x[todo]
    fact = 4.0 / math.sqrt(2.0 * math.pi) * (1.0 / xc + xc / math.pi**2)
    kmax = np.ceil(0.5 + xc / math.pi / math.sqrt(2.0) * np.sqrt(np.log(fact / eps))).astype(int)
    k = np.arange(int(kmax.max()))
    kplus = (k + 0.5)[None, :]
    xs = xc[:, None]
    terms = (8.0 / xs**2 + 2.0 / kplus**2 / math.pi**2) * np.exp(-2.0 * kplus**2 * math.pi**2 / xs**2)
    out[todo] = np.where(k[None, :] < kmax[:, None], terms, 0.0).sum(axis=1)
    return out


def ecce_p_value(sigma: np.ndarray) -> np.ndarray:
    """1 - F(sigma), with F the Kuiper range CDF above."""
    x = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    p = np.empty_like(x)
    p[x < SIGMA_MIN] = 1.0
    p[x >= SIGMA_MAX] = sys.float_info.epsilon
    middle = (x >= SIGMA_MIN) & (x < SIGMA_MAX)
    if middle.any():
        p[middle] = 1.0 - ecce_cdf(x[middle])
    return p


def grouped_ecce(
    p: np.ndarray, y: np.ndarray, w: np.ndarray | None, groups: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """(ECCE, sd) of each group 0..n_groups-1 of the rows (an empty or weightless group: 0, 0).

    One lexsort by (group, p); partial sums at the ends of runs of equal p within a group.
    """
    order = np.lexsort((p, groups))
    g, ps = groups[order], p[order]
    ws = np.ones(p.shape[0]) if w is None else w[order]
    residual = ws * (y[order] - ps)
    n = p.shape[0]
    end = np.ones(n, dtype=bool)
    end[:-1] = (g[1:] != g[:-1]) | (ps[1:] != ps[:-1])
    total = np.bincount(g, weights=ws, minlength=n_groups)
    variance = np.bincount(g, weights=ws * ws * ps * (1.0 - ps), minlength=n_groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt(variance) / total
    cum = np.cumsum(residual)
    group_start = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    present = g[group_start]
    before = np.concatenate(([0.0], cum))[group_start]  # the running sum where each group starts
    within = cum - np.repeat(before, np.diff(np.append(group_start, n)))
    # Only the run ends count: keep them, then reduce per group (every group has at least one).
    ends = np.flatnonzero(end)
    end_group_start = np.searchsorted(ends, group_start)
    high = np.maximum(np.maximum.reduceat(within[ends], end_group_start), 0.0)
    low = np.minimum(np.minimum.reduceat(within[ends], end_group_start), 0.0)
    ecce = np.zeros(n_groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        ecce[present] = (high - low) / total[present]
    bad = ~(total > 0)
    ecce[bad] = 0.0
    sd[bad] = 0.0
    return ecce, sd


def sigma_of(ecce: np.ndarray, sd: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sd == 0, np.where(ecce != 0, np.inf, 0.0), ecce / sd)


def _collapse(codes: np.ndarray, names: np.ndarray, max_values: int) -> tuple[np.ndarray, list[str]]:
    """Codes renumbered by first appearance (rows already in score order), infrequent values pooled."""
    n_values = names.shape[0]
    first = np.full(n_values, codes.shape[0])
    np.minimum.at(first, codes, np.arange(codes.shape[0]))
    labels = names.astype(object)
    if n_values > max_values:
        counts = np.bincount(codes, minlength=n_values)
        ranked = np.lexsort((first, -counts))  # most frequent first, ties by first appearance
        pooled = np.zeros(n_values, dtype=bool)
        pooled[ranked[max_values - 1:]] = True
        labels = np.where(pooled, OTHER, labels)
        # the pooled values become one value, first met where the first of them is
        keep = np.flatnonzero(~pooled)
        merged_first = np.append(first[keep], first[pooled].min())
        merged_label = np.append(labels[keep], OTHER)
        index_of = np.empty(n_values, dtype=np.int64)
        index_of[keep] = np.arange(keep.shape[0])
        index_of[pooled] = keep.shape[0]
        codes, first, labels = index_of[codes], merged_first, merged_label
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.shape[0])
    ordered = [None] * first.shape[0]
    for old, new in enumerate(rank):
        ordered[new] = str(labels[old])
    return rank[codes], ordered


#: Segment column names: they become JSON keys, pointers and metric labels.
COLUMN_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
#: At most this many segment columns in one request.
MAX_COLUMNS = 16


def factorize(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes into the sorted distinct values (a dict lookup per row: np.unique sorts Python strings
    several times slower)."""
    names = sorted(set(values.tolist()))
    lookup = {name: i for i, name in enumerate(names)}
    codes = np.fromiter((lookup[v] for v in values.tolist()), dtype=np.int64, count=values.shape[0])
    return codes, names


def check_segments(segments: Any, n: int, field: str = "segments") -> dict[str, np.ndarray]:
    """A column-wise object of categorical values, one string per row: {"country": ["br", ...], ...}."""
    if not isinstance(segments, dict):
        raise input_error(field, 'must be an object of columns, e.g. {"country": ["br", "us", ...]}')
    if not segments:
        raise input_error(field, "must name at least one column")
    if len(segments) > MAX_COLUMNS:
        raise input_error(field, f"at most {MAX_COLUMNS} columns")
    out = {}
    for name, values in segments.items():
        if not isinstance(name, str) or not COLUMN_NAME.fullmatch(name):
            raise input_error(field, f"column names are 1 to 64 letters, digits, '_' or '-' (got {str(name)[:70]!r})")
        if not isinstance(values, (list, tuple, np.ndarray)):
            raise input_error(f"{field}.{name}", "must be a list of strings, one per row")
        if len(values) != n:
            raise input_error(f"{field}.{name}", f"has {len(values)} values but there are {n} rows")
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise input_error(f"{field}.{name}", "must be a string", (i,))
        column = np.empty(n, dtype=object)
        column[:] = values
        out[name] = column
    return out


def top_values(values: np.ndarray, max_values: int) -> tuple[np.ndarray, list[str]]:
    """Codes of a column's values with its ``max_values`` most frequent kept (ties: the first met)
    and the rest pooled into ``OTHER``; the kept values by frequency, OTHER last."""
    codes, names = factorize(values)
    counts = np.bincount(codes, minlength=len(names))
    first = np.full(len(names), codes.shape[0])
    np.minimum.at(first, codes, np.arange(codes.shape[0]))
    ranked = np.lexsort((first, -counts))
    kept = ranked[:max_values]
    index_of = np.full(len(names), kept.shape[0], dtype=np.int64)
    index_of[kept] = np.arange(kept.shape[0])
    labels = [str(names[i]) for i in kept] + ([OTHER] if len(names) > max_values else [])
    return index_of[codes], labels


def check_options(options: Any, field: str = "options.multicalibration") -> dict[str, int | None]:
    """{max_depth, max_values, min_samples, max_segments}; null or missing keys take MCGrad's defaults."""
    defaults = {
        "max_depth": DEFAULT_MAX_DEPTH,
        "max_values": DEFAULT_MAX_VALUES,
        "min_samples": DEFAULT_MIN_SAMPLES,
        "max_segments": DEFAULT_MAX_SEGMENTS,
    }
    if options is None:
        return defaults
    if not isinstance(options, dict):
        raise input_error(field, "must be an object or null")
    out = dict(defaults)
    lowest = {"max_depth": 0, "max_values": 1, "min_samples": 1, "max_segments": 1}
    for key, value in options.items():
        if key not in defaults:
            raise input_error(f"{field}.{key}", f"unknown option (accepted: {', '.join(defaults)})")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest[key]:
            raise input_error(f"{field}.{key}", f"must be an integer >= {lowest[key]}")
        out[key] = value
    return out


def multicalibration_error(
    p: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None,
    segments: dict[str, np.ndarray],
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_values: int = DEFAULT_MAX_VALUES,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    max_segments: int | None = DEFAULT_MAX_SEGMENTS,
) -> dict[str, Any]:
    """Global ECCE, per-segment ECCE and the MCE of validated binary predictions (see the module docstring).

    ``segments`` maps column names to (n,) arrays of category values. Returns
    ``{"global": {ecce, sigma, p_value}, "mce", "mce_sigma", "mce_p_value",
    "n_segments", "segments": [{"values": {col: value}, "count", "ecce", "sigma", "p_value", "mde"}, ...],
    "worst": [...]}``, segments in MCGrad's order (the global one first, ``values`` {}); ``worst``: the
    WORST_SEGMENTS of them with the largest sigma (ties: more rows first).
    """
    n = p.shape[0]
    order = np.argsort(p, kind="stable")  # first appearance is taken in score order, as MCGrad does
    columns = []
    for name, values in segments.items():
        codes, names = factorize(np.asarray(values, dtype=object)[order])
        codes, labels = _collapse(codes, np.asarray(names, dtype=object), max_values)
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = codes
        columns.append((name, inverse, labels))
    limit = None
    if max_segments is not None:
        chunk = min(_CHUNK, max_segments)
        limit = -(-max_segments // chunk) * chunk
    found: list[tuple[dict[str, str], int, float, float]] = []
    depth_limit = len(columns) if max_depth is None else min(max_depth, len(columns))
    full = False
    for depth in range(depth_limit + 1):
        for subset in itertools.combinations(columns, depth):
            sizes = [len(labels) for _, _, labels in subset]
            code = np.zeros(n, dtype=np.int64)
            for (_, inverse, _), size in zip(subset, sizes):
                code = code * size + inverse
            n_groups = int(np.prod(sizes)) if sizes else 1
            counts = np.bincount(code, minlength=n_groups)
            kept = np.flatnonzero(counts >= min_samples)
            if kept.shape[0] == 0:
                continue
            ecce, sd = grouped_ecce(p, y, w, code, n_groups)
            for group in kept:
                values, rest = {}, int(group)
                for (name, _, labels), size in zip(reversed(subset), reversed(sizes)):
                    values[name] = labels[rest % size]
                    rest //= size
                found.append((dict(reversed(values.items())), int(counts[group]), float(ecce[group]), float(sd[group])))
                if limit is not None and len(found) >= limit:
                    full = True
                    break
            if full:
                break
        if full:
            break
    ecce = np.array([f[2] for f in found])
    sd = np.array([f[3] for f in found])
    sigma = sigma_of(ecce, sd)
    p_values = ecce_p_value(sigma)
    _, global_count, global_ecce, global_sd = found[0] if found else ({}, n, 0.0, 0.0)
    if not found:  # fewer rows than min_samples: the whole set alone, as it is (MCGrad has no segment then)
        e, s = grouped_ecce(p, y, w, np.zeros(n, dtype=np.int64), 1)
        global_ecce, global_sd = float(e[0]), float(s[0])
        ecce, sd = e, s
        sigma, p_values = sigma_of(e, s), ecce_p_value(sigma_of(e, s))
    mce_sigma = float(sigma.max())
    entries = [
        {"values": values, "count": count, "ecce": float(e), "sigma": float(s), "p_value": float(pv), "mde": MDE_SIGMAS * float(d)}
        for (values, count, _, _), e, s, pv, d in zip(found, ecce, sigma, p_values, sd)
    ]
    return {
        "global": {
            "ecce": global_ecce,
            "sigma": float(sigma[0]),
            "p_value": float(p_values[0]),
            "count": int(global_count),
            "mde": MDE_SIGMAS * float(global_sd),
        },
        "mce": mce_sigma * global_sd,
        "mce_sigma": mce_sigma,
        "mce_p_value": float(p_values.min()),
        "n_segments": len(found),
        "segments": entries,
        "worst": rank_by_sigma(entries)[:WORST_SEGMENTS],
    }


def rank_by_sigma(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segments, the strongest evidence of miscalibration (largest ``sigma``; NaN last) first, ties by more rows."""
    def key(entry: dict[str, Any]) -> tuple[float, int]:
        sigma = entry["sigma"]
        return (-math.inf if sigma is None or math.isnan(sigma) else sigma, entry["count"])

    return sorted(entries, key=key, reverse=True)
