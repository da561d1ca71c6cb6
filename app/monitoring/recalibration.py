"""The promotion rule of closed-loop recalibration: a paired comparison of log-loss.

A candidate version (refitted on recent feedback) and the current version are
scored on the same labelled rows that arrived after the candidate was fitted
(shadow evaluation: the candidate never saw them). Per row,

    d_i = loss_current(i) - loss_candidate(i),   loss = -log P(observed label),

and the candidate is promoted only if the mean improvement mean(d) exceeds
``margin`` AND the paired bootstrap interval of mean(d) (percentile, at
``level``) lies above zero. Otherwise the current version stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics.scores import LOG_LOSS_EPS


def row_log_loss(probabilities: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """-log of the probability given to the observed label, per row (clipped as calibd.metrics.log_loss)."""
    if probabilities.ndim == 1:
        picked = np.where(labels == 1, probabilities, 1.0 - probabilities)
    else:
        picked = probabilities[np.arange(labels.shape[0]), labels]
    return -np.log(np.clip(picked, LOG_LOSS_EPS, 1.0))


@dataclass(frozen=True)
class ShadowComparison:
    promote: bool
    improvement: float  # mean log-loss of current minus candidate, per row
    interval: tuple[float, float]
    n_rows: int
    current_log_loss: float
    candidate_log_loss: float
    reason: str


def compare_log_loss(
    current: np.ndarray,
    candidate: np.ndarray,
    labels: np.ndarray,
    margin: float = 0.001,
    level: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> ShadowComparison:
    """Decide whether ``candidate`` probabilities beat ``current`` on the same labelled rows."""
    difference = row_log_loss(current, labels) - row_log_loss(candidate, labels)
    n = difference.shape[0]
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    # Resample in blocks to bound memory at large n.
    block = max(1, 5_000_000 // max(n, 1))
    for start in range(0, n_resamples, block):
        stop = min(start + block, n_resamples)
        means[start:stop] = difference[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = (float(v) for v in np.quantile(means, [tail, 1.0 - tail]))
    improvement = float(difference.mean())
    promote = improvement > margin and low > 0.0
    if promote:
        reason = f"log-loss improved by {improvement:.5f} per row (> margin {margin}), {level:.0%} interval [{low:.5f}, {high:.5f}] above 0"
    elif improvement <= margin:
        reason = f"log-loss improved by {improvement:.5f} per row, not more than the margin {margin}"
    else:
        reason = f"{level:.0%} interval [{low:.5f}, {high:.5f}] of the improvement reaches 0"
    return ShadowComparison(
        promote=promote,
        improvement=improvement,
        interval=(low, high),
        n_rows=n,
        current_log_loss=float(row_log_loss(current, labels).mean()),
        candidate_log_loss=float(row_log_loss(candidate, labels).mean()),
        reason=reason,
    )
