"""Monitor windows: calibration metrics computed from per-bin sums.

Labelled feedback is reduced, as it arrives, to sums per equal-width bin of
the predicted probability (the same 15 bins as the default ECE: [k/15,
(k+1)/15), the last one closed). Sums add up across time buckets and across
replicas, so a window's metrics are a sum of rows read from the database:

    samples         = sum_b n_b
    ece             = sum_b |sum y - sum p|_b / samples
    brier           = sum_b (sum of per-row Brier terms)_b / samples
    log_loss        = sum_b (sum of per-row log-losses)_b / samples
    mean_prediction = sum_b (sum p)_b / samples
    positive_rate   = sum_b (sum y)_b / samples        (binary)

These are exactly ``calibd.metrics``' ECE, Brier and log-loss of the same pairs
(up to the order of floating-point additions). For multiclass feedback p is
the top-label confidence and y whether the top label was right (top-label
ECE); Brier and log-loss are the multiclass ones.

Selective calibrators monitor calibration on accepted rows only; the sums of
rejected rows carry only the acceptance count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np

from ..metrics.binned import DEFAULT_N_BINS, uniform_bins
from ..metrics.scores import LOG_LOSS_EPS

N_BINS = DEFAULT_N_BINS

#: Time windows, and count windows (the last N labelled predictions).
TIME_WINDOWS: dict[str, timedelta] = {"1h": timedelta(hours=1), "24h": timedelta(hours=24)}
COUNT_WINDOWS: dict[str, int] = {"last_10000": 10_000}
WINDOWS: tuple[str, ...] = (*TIME_WINDOWS, *COUNT_WINDOWS)

SUM_FIELDS = ("count", "sum_probability", "sum_label", "sum_brier", "sum_log_loss", "sum_accepted", "count_with_acceptance")


@dataclass
class FeedbackTerms:
    """Per-row quantities of a batch of labelled predictions."""

    probability: np.ndarray  # probability of class 1, or top-label confidence
    outcome: np.ndarray  # the label (binary) or whether the top label was right
    brier: np.ndarray
    log_loss: np.ndarray
    accepted: np.ndarray | None = None


def feedback_terms(probabilities: np.ndarray, labels: np.ndarray, accepted: np.ndarray | None = None) -> FeedbackTerms:
    """Per-row terms of validated (n,) or (n, K) probabilities and integer labels."""
    if probabilities.ndim == 1:
        p = probabilities
        y = labels.astype(np.float64)
        q = np.clip(p, LOG_LOSS_EPS, 1.0 - LOG_LOSS_EPS)
        return FeedbackTerms(p, y, (p - y) ** 2, -np.where(labels == 1, np.log(q), np.log1p(-q)), accepted)
    rows = np.arange(probabilities.shape[0])
    top = probabilities.argmax(axis=1)
    picked = probabilities[rows, labels]
    brier = np.einsum("ij,ij->i", probabilities, probabilities) - 2.0 * picked + 1.0
    return FeedbackTerms(
        probabilities[rows, top],
        (top == labels).astype(np.float64),
        brier,
        -np.log(np.clip(picked, LOG_LOSS_EPS, 1.0)),
        accepted,
    )


@dataclass
class BinSums:
    """Sums per bin (arrays of length N_BINS) over a set of labelled predictions."""

    count: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    sum_probability: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    sum_label: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    sum_brier: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    sum_log_loss: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    sum_accepted: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    count_with_acceptance: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))

    @classmethod
    def of(cls, terms: FeedbackTerms) -> BinSums:
        """Sums of a batch. Rejected rows (``accepted`` False) count toward acceptance only."""
        bins = uniform_bins(terms.probability, N_BINS)
        if terms.accepted is None:
            kept = np.ones(bins.shape[0], dtype=bool)
            with_acceptance = np.zeros(N_BINS)
            accepted = np.zeros(N_BINS)
        else:
            kept = terms.accepted.astype(bool)
            with_acceptance = np.bincount(bins, minlength=N_BINS).astype(np.float64)
            accepted = np.bincount(bins, weights=kept.astype(np.float64), minlength=N_BINS)
        b = bins[kept]

        def total(values: np.ndarray) -> np.ndarray:
            return np.bincount(b, weights=values[kept], minlength=N_BINS)

        return cls(
            count=np.bincount(b, minlength=N_BINS).astype(np.float64),
            sum_probability=total(terms.probability),
            sum_label=total(terms.outcome),
            sum_brier=total(terms.brier),
            sum_log_loss=total(terms.log_loss),
            sum_accepted=accepted,
            count_with_acceptance=with_acceptance,
        )

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> BinSums:
        """From (bin, count, sum_probability, ...) rows in SUM_FIELDS order, as the database returns them."""
        sums = cls()
        for bin_, *values in rows:
            for name, value in zip(SUM_FIELDS, values):
                getattr(sums, name)[int(bin_)] += float(value)
        return sums

    @classmethod
    def from_table(cls, table: np.ndarray) -> BinSums:
        """From an array (SUM_FIELDS, bins), as ``table`` gives it."""
        return cls(**{name: np.array(table[f], dtype=np.float64) for f, name in enumerate(SUM_FIELDS)})

    def table(self) -> np.ndarray:
        """The sums as one array (SUM_FIELDS, bins)."""
        return np.stack([getattr(self, name) for name in SUM_FIELDS])

    def rows(self) -> list[dict[str, float | int]]:
        """Non-empty bins as dicts of SUM_FIELDS plus ``bin``."""
        return [
            {"bin": b, **{name: _number(getattr(self, name)[b], name) for name in SUM_FIELDS}}
            for b in range(N_BINS)
            if self.count[b] > 0 or self.count_with_acceptance[b] > 0
        ]


def group_sums(probability: np.ndarray, labels: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """``BinSums.of`` of binary rows without acceptance for many groups at once, as an array
    (n_groups, SUM_FIELDS, bins): ``groups[i]`` is row i's group, in ``0..n_groups-1``."""
    terms = feedback_terms(probability, labels)
    index = groups * N_BINS + uniform_bins(terms.probability, N_BINS)
    out = np.zeros((len(SUM_FIELDS), n_groups * N_BINS))
    size = n_groups * N_BINS
    out[0] = np.bincount(index, minlength=size)
    for f, values in ((1, terms.probability), (2, terms.outcome), (3, terms.brier), (4, terms.log_loss)):
        out[f] = np.bincount(index, weights=values, minlength=size)
    return out.reshape(len(SUM_FIELDS), n_groups, N_BINS).transpose(1, 0, 2).copy()


#: The metrics ``window_metrics`` gives, in its order.
METRICS = ("samples", "ece", "brier", "log_loss", "mean_prediction", "positive_rate", "acceptance_rate")


def metrics_table(sums: np.ndarray, binary: np.ndarray) -> dict[str, np.ndarray]:
    """``window_metrics`` of many windows at once: ``sums`` is (n, SUM_FIELDS, bins), ``binary`` (n,);
    each metric an array (n,), NaN where ``window_metrics`` gives None."""
    totals = sums.sum(axis=2)
    field = {name: totals[:, f] for f, name in enumerate(SUM_FIELDS)}
    n = field["count"]
    with np.errstate(divide="ignore", invalid="ignore"):
        some = n > 0
        out = {
            "samples": n,
            "ece": np.where(some, np.abs(sums[:, 2] - sums[:, 1]).sum(axis=1) / n, np.nan),
            "brier": np.where(some, field["sum_brier"] / n, np.nan),
            "log_loss": np.where(some, field["sum_log_loss"] / n, np.nan),
            "mean_prediction": np.where(some, field["sum_probability"] / n, np.nan),
            "positive_rate": np.where(some & binary, field["sum_label"] / n, np.nan),
        }
        with_acceptance = field["count_with_acceptance"]
        out["acceptance_rate"] = np.where(with_acceptance > 0, field["sum_accepted"] / with_acceptance, np.nan)
    return out


def _number(value: float, name: str) -> float | int:
    return int(value) if name.startswith("count") or name == "sum_accepted" else float(value)


def window_metrics(sums: BinSums, binary: bool = True) -> dict[str, float | None]:
    """The metrics of a window from its bin sums; None where the window is empty."""
    n = float(sums.count.sum())
    with_acceptance = float(sums.count_with_acceptance.sum())
    metrics: dict[str, float | None] = {"samples": int(n)}
    if n > 0:
        metrics |= {
            "ece": float(np.abs(sums.sum_label - sums.sum_probability).sum() / n),
            "brier": float(sums.sum_brier.sum() / n),
            "log_loss": float(sums.sum_log_loss.sum() / n),
            "mean_prediction": float(sums.sum_probability.sum() / n),
            "positive_rate": float(sums.sum_label.sum() / n) if binary else None,
        }
    else:
        metrics |= dict.fromkeys(("ece", "brier", "log_loss", "mean_prediction", "positive_rate"))
    metrics["acceptance_rate"] = float(sums.sum_accepted.sum() / with_acceptance) if with_acceptance > 0 else None
    return metrics
