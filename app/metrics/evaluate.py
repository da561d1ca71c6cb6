"""``evaluate``: every calibration metric of a set of predictions, in the shape of ``POST /evaluate``.

    >>> evaluate(probabilities, labels, sample_weight=None, metrics=None, options=None)
    {"metrics": {"ece": {"value": 0.031, "ci": None, "params": {...}}, ...},
     "reliability": {"target": "binary", "binning": "uniform", "n_bins": 15, "level": 0.95, "bins": [...]}}

Binary input is a flat ``(n,)`` array of the probability of class 1 with 0/1
labels; multiclass input is ``(n, K)`` rows (summing to 1 within 1e-3, then
renormalised) with labels ``0..K-1``. ``metrics`` None computes the default
set, :data:`DEFAULT_METRICS` (all of them, less ``spiegelhalter_z`` under a
``classwise`` target, where it is undefined).

``options`` (every key optional; null means the default):

* ``n_bins`` (15), ``binning`` (``uniform`` | ``quantile``), ``norm``
  (``l1`` | ``l2`` | ``max``): the ECE family, the Brier decomposition and
  the reliability diagram;
* ``target`` (``binary`` | ``top_label`` | ``classwise``; default ``binary``
  for flat input, ``top_label`` for rows, and ``classwise`` for ACE on rows);
* ``lambda`` (10): the rounding of ``lp_error_*``;
* ``segment_values`` (50): with ``segments``, the metrics per segment are
  given for this many most frequent values of each column, the rest pooled
  into ``__OTHER``;
* ``multicalibration`` (null: MCGrad's defaults): with ``segments``,
  ``{"max_depth": 3, "max_values": 3, "min_samples": 10, "max_segments": 1000}``
  of the multicalibration error (``calibd.metrics.multicalibration``);
* ``bootstrap`` (null: no intervals): ``{"n_resamples": 1000, "seed": 0,
  "level": 0.95}``, percentile intervals for every metric (``ci``); its
  ``level`` is also the Wilson level of the diagram (else 0.95).

Each metric reports ``value``, ``ci`` and the ``params`` that define it
(binning convention, target, bandwidth...). ``spiegelhalter_z`` adds
``p_value``; ``brier`` adds its ``decomposition``. A value that is undefined
(Spiegelhalter's Z with zero variance) is None.

Every input error raises ``CalibrationInputError`` naming the field:
``probabilities``/``labels``/``sample_weight`` with the index of the first
bad element, ``metrics`` with the index of the bad name, ``options.<key>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .binned import (
    BINNINGS,
    DEFAULT_N_BINS,
    NORMS,
    ace_prepared,
    check_choice,
    check_n_bins,
    ece_prepared,
)
from .bootstrap import (
    DEFAULT_RESAMPLES,
    check_bootstrap,
    has_weight,
    percentile_interval,
    resample_indices,
)
from .debiased import debiased_prepared
from .inputs import Prepared, binary_problems, input_error, prepare, resolve_target
from .lp import DEFAULT_LAMBDA, check_lambda, lp_cells, lp_from_cells
from .multicalibration import OTHER, check_segments, multicalibration_error, top_values
from .multicalibration import check_options as check_mc_options
from .reliability import DEFAULT_LEVEL, reliability_prepared
from .scores import (
    LOG_LOSS_EPS,
    brier_decomposition_prepared,
    brier_prepared,
    log_loss_prepared,
)
from .smooth import smooth_ece_prepared
from .unbinned import (
    interval_from_sums,
    ks_from_sums,
    problem_sums,
    spiegelhalter_prepared,
)

BIN_CONVENTION = "left-closed [e_k, e_{k+1}), last bin closed (1.0 in the last bin)"
OPTION_KEYS = ("n_bins", "binning", "norm", "target", "lambda", "bootstrap", "multicalibration", "segment_values")
#: Per segment column, the metrics of this many most frequent values (the rest pooled), by default.
DEFAULT_SEGMENT_VALUES = 50
MAX_SEGMENT_VALUES = 1000
BOOTSTRAP_KEYS = ("n_resamples", "seed", "level")


@dataclass(frozen=True)
class Options:
    n_bins: int
    binning: str
    norm: str
    target: str  # resolved
    ace_target: str  # resolved
    lam: int
    bootstrap: tuple[int, int, float] | None

    @property
    def level(self) -> float:
        return self.bootstrap[2] if self.bootstrap else DEFAULT_LEVEL


@dataclass(frozen=True)
class Metric:
    """``compute(data, options, cache)`` gives the value, or (value, by-product) for
    smooth_ece (the bandwidth) and spiegelhalter_z (the p-value); ``params(options)``
    describes it. ``cache`` holds what metrics of one sample share (sorted run sums,
    the l_p cells)."""

    compute: Callable[[Prepared, Options, dict], Any]
    params: Callable[[Options], dict[str, Any]]

    def value(self, data: Prepared, options: Options, cache: dict) -> float:
        result = self.compute(data, options, cache)
        return float(result[0] if isinstance(result, tuple) else result)


def _cached(cache: dict, key: Any, make: Callable[[], Any]) -> Any:
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _sums(d: Prepared, o: Options, cache: dict) -> list:
    return _cached(cache, ("run_sums", o.target), lambda: problem_sums(d, o.target))


def _lp(order: float) -> Metric:
    label: Any = "inf" if math.isinf(order) else int(order)
    return Metric(
        compute=lambda d, o, c: lp_from_cells(_cached(c, ("lp", o.lam), lambda: lp_cells(d, o.lam)), order),
        params=lambda o: {"p": label, "lambda": o.lam, "bins": "distinct rounded vectors floor(lambda f) / lambda"},
    )


METRICS: dict[str, Metric] = {
    "ece": Metric(
        compute=lambda d, o, c: ece_prepared(d, o.n_bins, o.binning, o.norm, o.target),
        params=lambda o: {"n_bins": o.n_bins, "binning": o.binning, "norm": o.norm, "target": o.target, "bins": BIN_CONVENTION},
    ),
    "debiased_l2_ce": Metric(
        compute=lambda d, o, c: debiased_prepared(d, o.n_bins, "quantile", o.target),
        params=lambda o: {
            "n_bins": o.n_bins,
            "binning": "quantile",
            "target": o.target,
            "bins": "Kumar et al. 2019 equal-mass: midpoint edges between np.array_split chunks, right-closed",
            "value": "root of the debiased squared l2 error, as uncertainty-calibration returns it",
        },
    ),
    "smooth_ece": Metric(
        compute=lambda d, o, c: smooth_ece_prepared(d, o.target),
        params=lambda o: {"target": o.target, "kernel": "reflected Gaussian, relplot 1.0.3 discretisation"},
    ),
    "ace": Metric(
        compute=lambda d, o, c: ace_prepared(d, o.n_bins, o.ace_target),
        params=lambda o: {"n_bins": o.n_bins, "target": o.ace_target, "bins": "equal-mass ranges per class (Nixon et al. 2019)"},
    ),
    "ks_error": Metric(
        compute=lambda d, o, c: ks_from_sums(_sums(d, o, c)),
        params=lambda o: {"target": o.target},
    ),
    "spiegelhalter_z": Metric(
        compute=lambda d, o, c: spiegelhalter_prepared(d, o.target),
        params=lambda o: {"target": o.target, "test": "two-sided, standard normal"},
    ),
    "interval_calibration": Metric(
        compute=lambda d, o, c: interval_from_sums(_sums(d, o, c)),
        params=lambda o: {"target": o.target, "intervals": "(a, b] over the prediction axis (papers/003)"},
    ),
    "lp_error_1": _lp(1.0),
    "lp_error_2": _lp(2.0),
    "lp_error_inf": _lp(math.inf),
    "brier": Metric(
        compute=lambda d, o, c: brier_prepared(d),
        params=lambda o: {"classes": "positive class (binary) / sum over the K classes (multiclass)"},
    ),
    "log_loss": Metric(
        compute=lambda d, o, c: log_loss_prepared(d),
        params=lambda o: {"eps": LOG_LOSS_EPS},
    ),
}

DEFAULT_METRICS = tuple(METRICS)


def _check_options(data: Prepared, options: Any) -> Options:
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise input_error("options", "must be an object or null")
    for key in options:
        if key not in OPTION_KEYS:
            raise input_error(f"options.{key}", f"unknown option (accepted: {', '.join(OPTION_KEYS)})")

    def get(key: str, default: Any) -> Any:
        value = options.get(key)
        return default if value is None else value

    n_bins = check_n_bins(get("n_bins", DEFAULT_N_BINS))
    binning = check_choice(get("binning", "uniform"), BINNINGS, "options.binning")
    norm = check_choice(get("norm", "l1"), NORMS, "options.norm")
    raw_target = options.get("target")
    target = resolve_target(data, raw_target)
    ace_target = resolve_target(data, raw_target if raw_target is not None else ("binary" if data.binary else "classwise"))
    lam = check_lambda(get("lambda", DEFAULT_LAMBDA))
    bootstrap = options.get("bootstrap")
    if bootstrap is not None:
        if not isinstance(bootstrap, dict):
            raise input_error("options.bootstrap", "must be an object {n_resamples, seed, level} or null")
        for key in bootstrap:
            if key not in BOOTSTRAP_KEYS:
                raise input_error(f"options.bootstrap.{key}", f"unknown option (accepted: {', '.join(BOOTSTRAP_KEYS)})")
        bootstrap = check_bootstrap(
            DEFAULT_RESAMPLES if bootstrap.get("n_resamples") is None else bootstrap["n_resamples"],
            0 if bootstrap.get("seed") is None else bootstrap["seed"],
            DEFAULT_LEVEL if bootstrap.get("level") is None else bootstrap["level"],
        )
    return Options(n_bins, binning, norm, target, ace_target, lam, bootstrap)


def _check_segment_values(value: Any) -> int:
    if value is None:
        return DEFAULT_SEGMENT_VALUES
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SEGMENT_VALUES:
        raise input_error("options.segment_values", f"must be an integer from 1 to {MAX_SEGMENT_VALUES}")
    return value


def _check_metrics(metrics: Any, options: Options) -> list[str]:
    if metrics is None:
        names = list(DEFAULT_METRICS)
        if options.target == "classwise":
            names.remove("spiegelhalter_z")
        return names
    if not isinstance(metrics, (list, tuple)):
        raise input_error("metrics", "must be a list of metric names or null")
    names: list[str] = []
    for i, name in enumerate(metrics):
        if not isinstance(name, str) or name not in METRICS:
            raise input_error("metrics", f"unknown metric (known: {', '.join(METRICS)})", (i,))
        if name == "spiegelhalter_z" and options.target == "classwise":
            raise input_error("metrics", "spiegelhalter_z is defined for the binary and top_label targets", (i,))
        if name not in names:
            names.append(name)
    return names


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _metrics(data: Prepared, opts: Options, names: list[str]) -> dict[str, Any]:
    """Each metric of ``names`` on ``data``, with bootstrap intervals if asked."""
    cache: dict = {}
    out: dict[str, Any] = {}
    weighted = has_weight(data)
    for name in names:
        metric = METRICS[name]
        result = metric.compute(data, opts, cache) if weighted else math.nan
        value, extra = result if isinstance(result, tuple) else (result, None)
        entry: dict[str, Any] = {"value": _number(value), "ci": None, "params": metric.params(opts)}
        if name == "spiegelhalter_z":
            entry["p_value"] = _number(extra) if weighted else None
        elif name == "smooth_ece":
            entry["params"]["sigma"] = extra
        elif name == "brier" and weighted:
            decomposition = brier_decomposition_prepared(data, opts.n_bins, opts.binning)
            decomposition.pop("brier")
            entry["decomposition"] = {**decomposition, "n_bins": opts.n_bins, "binning": opts.binning, "bins": BIN_CONVENTION}
        out[name] = entry
    if opts.bootstrap is not None:
        n_resamples, seed, level = opts.bootstrap
        values = {name: np.empty(n_resamples) for name in names}
        for r, rows in enumerate(resample_indices(data.n, n_resamples, seed)):
            sample, sample_cache = data.take(rows), {}
            for name in names:
                values[name][r] = METRICS[name].value(sample, opts, sample_cache) if has_weight(sample) else np.nan
        for name in names:
            out[name]["ci"] = percentile_interval(values[name], level)
            out[name]["params"]["bootstrap"] = {
                "n_resamples": n_resamples, "seed": seed, "level": level, "interval": "percentile",
            }
    return out


def _segment_metrics(data: Prepared, opts: Options, names: list[str], columns: dict[str, np.ndarray], max_values: int) -> dict:
    """Per column, per value (its ``max_values`` most frequent; the rest pooled into ``__OTHER``): the metrics
    of its rows, with their count (and weight)."""
    out: dict[str, list] = {}
    for column, values in columns.items():
        codes, labels = top_values(values, max_values)
        entries = []
        for code, label in enumerate(labels):
            rows = np.flatnonzero(codes == code)
            subset = data.take(rows)
            entry: dict[str, Any] = {"value": label, "count": int(rows.shape[0])}
            if data.w is not None:
                entry["weight"] = float(subset.w.sum())
            entry["metrics"] = _metrics(subset, opts, names)
            entries.append(entry)
        out[column] = entries
    return out


def _multicalibration(data: Prepared, opts: Options, columns: dict[str, np.ndarray], options: dict) -> dict | None:
    """ECCE per segment and the MCE on the target's binary problem (None for classwise: K problems)."""
    problems = binary_problems(data, opts.target)
    if len(problems) != 1:
        return None
    ((p, y),) = problems
    result = multicalibration_error(p, y, data.w, columns, **options)
    for entry in (result["global"], *result["segments"]):  # worst holds the same dicts
        entry["sigma"] = _number(entry["sigma"])  # infinite (a segment with no variance but an error) -> null
        entry["mde"] = _number(entry["mde"])
    result["mce_sigma"] = _number(result["mce_sigma"])
    result["mce"] = _number(result["mce"])
    result["params"] = {**options, "target": opts.target, "pooled_value": OTHER}
    return result


def evaluate(
    probabilities,
    labels,
    sample_weight=None,
    metrics=None,
    options=None,
    max_bootstrap_rows: int | None = None,
    segments=None,
) -> dict[str, Any]:
    """Validate, compute the metrics (with bootstrap intervals if asked) and the reliability diagram.

    ``max_bootstrap_rows`` bounds n * n_resamples (a service's work limit),
    counting every row once more per segment column; over it,
    ``options.bootstrap.n_resamples`` is rejected.

    ``segments`` (a column-wise object of category strings, one per row) adds
    ``segments`` (the metrics per column and value, with counts) and
    ``multicalibration`` (ECCE per segment and the MCE, see
    ``calibd.metrics.multicalibration``).
    """
    data = prepare(probabilities, labels, sample_weight)
    opts = _check_options(data, options)
    names = _check_metrics(metrics, opts)
    columns = check_segments(segments, data.n) if segments is not None else None
    mc_options = check_mc_options((options or {}).get("multicalibration") if isinstance(options, dict) else None)
    segment_values = _check_segment_values((options or {}).get("segment_values") if isinstance(options, dict) else None)
    passes = 1 + (len(columns) if columns else 0)
    if opts.bootstrap is not None and max_bootstrap_rows is not None and data.n * passes * opts.bootstrap[0] > max_bootstrap_rows:
        rows = data.n * passes
        raise input_error(
            "options.bootstrap.n_resamples",
            f"n_resamples x rows must be at most {max_bootstrap_rows:,} here ({rows:,} rows"
            f"{' counting each segment column' if passes > 1 else ''}: at most "
            f"{max(max_bootstrap_rows // rows, 0):,} resamples)",
        )
    out = _metrics(data, opts, names)
    reliability = reliability_prepared(data, opts.n_bins, opts.binning, opts.target, opts.level)
    result: dict[str, Any] = {"metrics": out, "reliability": reliability}
    if columns is not None:
        result["segments"] = _segment_metrics(data, opts, names, columns, segment_values)
        result["multicalibration"] = _multicalibration(data, opts, columns, mc_options)
    return result
