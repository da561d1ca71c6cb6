"""Histogram binning with equal-mass bins and a beta prior toward the base rate.

    p'(s) = (sum_{i in bin(s)} w_i y_i + S r) / (sum_{i in bin(s)} w_i + S)

where r = sum w y / sum w is the holdout's weighted positive rate and S the
option ``prior_strength`` (a Beta(S r, S (1 - r)) prior on each bin's rate;
S = 0 gives the plain bin mean). S is in units of weight, i.e. of samples
when there are no sample weights. Zadrozny & Elkan (2001), "Obtaining
calibrated probability estimates from decision trees and naive Bayesian
classifiers" (histogram binning); the shrinkage is the posterior mean of a
beta-binomial model, so that small bins are not exactly 0 or 1.

Bins are equal-mass on the holdout scores, on the scale they are given in
(probabilities or logits; a monotone change of scale gives the same bins).
Copies of a score are never split between bins: with the distinct holdout
scores u_1 < ... < u_m, the weight before u_j is c_j = sum of w_i over s_i <
u_j, and the k-th edge (k = 1 .. n_bins - 1) is the u_j whose c_j is nearest
to k W / n_bins (W the total weight; halfway goes to the upper one). Without
ties or weights, n = 10 and 5 bins give 2, 2, 2, 2, 2 points and 3 bins give
3, 4, 3. A weight of k counts exactly as k copies of the row.

Convention: bins are left-closed, [e_k, e_{k+1}), the last one closed; a
score below the first edge is in the first bin and a score above the last
edge in the last one, so scores outside the holdout range go to the end bins.
Ties, and n_bins larger than the number of distinct scores, give repeated
edges or an edge at the smallest score; those would make empty bins, so they
are dropped (the empty bins merge into their neighbour) and the fit may have
fewer bins than ``n_bins``. Every bin keeps at least one holdout score.

The output is piecewise constant and not necessarily non-decreasing in the
score (``monotone = False``): no order is imposed on the bin values.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np

from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import check_min_probability, keep_off_edges, state_array, state_number

MAX_BINS = 1000


def equal_mass_edges(scores: np.ndarray, weights: np.ndarray, n_bins: int) -> np.ndarray:
    """Interior edges of at most ``n_bins`` non-empty equal-mass bins [e_k, e_{k+1}).

    Each edge is the distinct score whose preceding weight is nearest to
    k W / n_bins. Returns strictly increasing edges, all holdout scores and
    all above the smallest one, so that no bin is empty.
    """
    # Rows of zero weight are absent (a weight acts as a repeat count): none becomes an edge.
    scores, weights = scores[weights > 0], weights[weights > 0]
    distinct, inverse = np.unique(scores, return_inverse=True)
    distinct_weights = np.bincount(inverse, weights=weights, minlength=distinct.shape[0])
    before = np.concatenate([[0.0], np.cumsum(distinct_weights)[:-1]])
    targets = np.arange(1, n_bins) * (float(weights.sum()) / n_bins)
    upper = np.minimum(np.searchsorted(before, targets, side="left"), distinct.shape[0] - 1)
    lower = np.maximum(upper - 1, 0)
    nearest = np.where(targets - before[lower] < before[upper] - targets, lower, upper)
    return np.unique(distinct[nearest[nearest > 0]])


def check_n_bins(value: Any, field: str = "options.n_bins") -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= MAX_BINS:
        raise CalibrationInputError(field, f"must be an integer from 1 to {MAX_BINS}")


def check_bins(calibrator: Calibrator, edges_within: tuple[float, float] | None) -> None:
    """The learned state of a histogram (``edges_``, ``values_``, ``bin_weights_``): edges in
    order, one value and one weight per bin (one bin more than edges), values within [0, 1]."""
    edges = state_array(calibrator.edges_, "edges_", within=edges_within, non_decreasing=True)
    bins = (edges.shape[0] + 1,)
    state_array(calibrator.values_, "values_", shape=bins, within=(0.0, 1.0))
    state_array(calibrator.bin_weights_, "bin_weights_", shape=bins, within=(0.0, np.inf))


class HistogramCalibrator(Calibrator):
    """Histogram binning: p'(s) = (sum_{bin(s)} w y + S r) / (sum_{bin(s)} w + S), equal-mass bins.

    Each bin's weighted mean label, shrunk toward the holdout's positive rate r by a
    Beta(S r, S (1 - r)) prior. Bins are left-closed, [e_k, e_{k+1}); scores outside the
    holdout's range go to the end bins.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (the bins do not depend on it).
    n_bins : int, default=10
        The number of equal-mass bins, 1 to 1000; fewer when ties leave fewer distinct scores.
    prior_strength : float, default=2.0
        S, the prior's weight (in units of sample weight); 0 gives the raw bin means.
    min_probability : float or None, default=None
        Outputs are kept within [m, 1 - m]: None is m = 1 / (2 (n + 1)) for n holdout rows;
        0 keeps the raw means (see ``keep_off_edges``).

    Attributes
    ----------
    edges_ : ndarray of shape (n_bins_fitted - 1,)
        The interior bin edges, increasing, on the scores' own scale.
    values_ : ndarray of shape (n_bins_fitted,)
        Each bin's output probability.
    bin_weights_ : ndarray of shape (n_bins_fitted,)
        The holdout weight in each bin.
    base_rate_ : float
        r, the holdout's weighted positive rate.

    References
    ----------
    B. Zadrozny and C. Elkan, "Obtaining calibrated probability estimates from decision
    trees and naive Bayesian classifiers", ICML 2001.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.histogram import HistogramCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = HistogramCalibrator(n_bins=10).fit(scores, labels)
    >>> calibrator.values_.shape, round(calibrator.base_rate_, 3)
    ((10,), 0.366)
    >>> calibrator.predict([0.2, 0.5, 0.8]).round(3)
    array([0.033, 0.245, 0.687])
    """

    method = "histogram"
    monotone = False
    fitted_attributes = ("edges_", "values_", "bin_weights_", "base_rate_")

    def __init__(
        self, input: str = "probability", n_bins: int = 10, prior_strength: float = 2.0, min_probability: float | None = None
    ):
        self.input = input
        self.n_bins = n_bins
        self.prior_strength = prior_strength
        self.min_probability = min_probability

    def _check_params(self) -> None:
        check_n_bins(self.n_bins)
        s = self.prior_strength
        if isinstance(s, bool) or not isinstance(s, Real) or not np.isfinite(s) or s < 0:
            raise CalibrationInputError("options.prior_strength", "must be a finite number >= 0")
        check_min_probability(self.min_probability)

    def _check_state(self) -> None:
        check_bins(self, (0.0, 1.0) if self.input == "probability" else None)
        if not 0.0 <= state_number(self.base_rate_, "base_rate_") <= 1.0:
            raise CalibrationInputError("state.base_rate_", "must lie within [0, 1]")

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        edges = equal_mass_edges(scores, weights, int(self.n_bins))
        index = np.searchsorted(edges, scores, side="right")
        n = edges.shape[0] + 1
        bin_weights = np.bincount(index, weights=weights, minlength=n)
        bin_positives = np.bincount(index, weights=weights * labels, minlength=n)
        rate = float(np.dot(weights, labels) / weights.sum())
        s = float(self.prior_strength)
        denominator = bin_weights + s
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(denominator > 0, (bin_positives + s * rate) / denominator, rate)
        self.edges_ = edges
        self.values_ = keep_off_edges(np.clip(values, 0.0, 1.0), self.min_probability, np.count_nonzero(weights > 0))
        self.bin_weights_ = bin_weights
        self.base_rate_ = rate

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return self.values_[np.searchsorted(self.edges_, scores, side="right")]

    def fit_info(self) -> dict[str, Any]:
        return {
            "n_bins": int(self.values_.shape[0]),
            "edges": self.edges_.tolist(),
            "values": self.values_.tolist(),
            "bin_weights": self.bin_weights_.tolist(),
            "base_rate": self.base_rate_,
        }
