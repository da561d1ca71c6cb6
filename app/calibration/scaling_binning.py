"""The scaling-binning calibrator: Platt scaling, then binning of its outputs.

    g(s) = sigmoid(A z + B)                  (Platt scaling, z the logit of s)
    p'(s) = sum_{i in bin(g(s))} w_i g(s_i) / sum_{i in bin(g(s))} w_i

Step 1 fits Platt scaling; step 2 cuts the Platt outputs of the holdout into
``n_bins`` bins holding equal numbers of points; step 3 outputs, for each bin,
the mean of the Platt values in it (not of the labels: that is what
separates it from histogram binning and gives its lower variance). The output
takes at most ``n_bins`` values, so its calibration error can be measured.
Kumar, Liang & Ma (2019), "Verified uncertainty calibration", NeurIPS.

Reference implementation: PyPI ``uncertainty-calibration`` 0.1.4,
``calibration.PlattBinnerCalibrator``, which this follows:

- No data split. The paper's analysis fits the three steps on three disjoint
  parts of the calibration set (T1, T2, T3); the reference implementation
  fits all three on the whole set (its ``num_calibration`` argument is not
  used to split), and so does this one.
- Bins (``utils.get_equal_bins``): sort the holdout's Platt outputs, split
  them into min(n_bins, n) consecutive runs of equal count as
  ``np.array_split`` does (the first n mod n_bins runs get one extra point),
  and put an edge halfway between the last value of each run and the first
  of the next. Repeated edges are merged, so ties can leave fewer bins.
- Bins are right-closed, (e_{k-1}, e_k], the first one starting at 0 and the
  last one ending at 1 (``np.searchsorted`` with side="left"). A tie at a
  run boundary puts the edge on the tied value, and all its copies go to the
  lower bin.
- A bin that ends up with no holdout point (possible only through such ties)
  outputs the midpoint of its two edges, with 0 and 1 as the outer edges.

Differences: the reference fits Platt with scikit-learn's
``LogisticRegression(C=1e10)`` (lbfgs, default tolerance) and ignores sample
weights; here Platt is calibd's ``PlattCalibrator`` (Newton to convergence,
weighted), and the bin values are weighted means of the Platt values (a bin
whose points all have weight 0 counts as empty). The bin edges are by count
of points, weights not counted, as in the reference. With unit weights the
output matches the reference up to the tolerance of its lbfgs fit.

Like Platt scaling, the output is non-decreasing in the score when A >= 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Calibrator
from .validation import state_number
from .histogram import check_bins, check_n_bins
from .platt import PlattCalibrator


def equal_count_edges(sorted_values: np.ndarray, n_bins: int) -> np.ndarray:
    """Interior edges between ``np.array_split`` runs of ``sorted_values``, midpoints, merged, below 1."""
    n = sorted_values.shape[0]
    k = min(n_bins, n)
    i = np.arange(1, k)
    starts = i * (n // k) + np.minimum(i, n % k)
    edges = np.unique((sorted_values[starts - 1] + sorted_values[starts]) / 2.0)
    return edges[edges < 1.0]


def binned_means(g: np.ndarray, weights: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(edges, bin values, bin weights) of the reference's binning of values ``g`` in [0, 1].

    Bins (e_{k-1}, e_k] from ``equal_count_edges``; each bin's value is the
    weighted mean of the ``g`` in it, or the midpoint of its edges (outer
    edges 0 and 1) when it holds no weight.
    """
    edges = equal_count_edges(np.sort(g), n_bins)
    index = np.searchsorted(edges, g, side="left")
    n = edges.shape[0] + 1
    bin_weights = np.bincount(index, weights=weights, minlength=n)
    bin_sums = np.bincount(index, weights=weights * g, minlength=n)
    bounds = np.concatenate([[0.0], edges, [1.0]])
    midpoints = (bounds[:-1] + bounds[1:]) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(bin_weights > 0, bin_sums / bin_weights, midpoints)
    return edges, np.clip(values, 0.0, 1.0), bin_weights


class ScalingBinningCalibrator(Calibrator):
    """Scaling-binning: p'(s) = the mean of g over bin(g(s)), g(s) = sigmoid(A z + B) Platt's output.

    Platt scaling, then equal-count bins on the holdout's Platt outputs; each bin outputs the
    (weighted) mean of the Platt values in it, not of the labels, so the output takes at
    most ``n_bins`` values. Bins are right-closed, (e_{k-1}, e_k], outer edges 0 and 1.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    n_bins : int, default=10
        The number of bins, 1 to 1000; fewer when ties leave fewer distinct Platt values.

    Attributes
    ----------
    platt_a_, platt_b_ : float
        Platt's slope A and offset B.
    edges_ : ndarray of shape (n_bins_fitted - 1,)
        The interior bin edges on the Platt-output scale, increasing.
    values_ : ndarray of shape (n_bins_fitted,)
        Each bin's output probability.
    bin_weights_ : ndarray of shape (n_bins_fitted,)
        The holdout weight in each bin.

    References
    ----------
    A. Kumar, P. Liang and T. Ma, "Verified uncertainty calibration", NeurIPS 2019.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.scaling_binning import ScalingBinningCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = ScalingBinningCalibrator(n_bins=10).fit(scores, labels)
    >>> calibrator.predict([0.2, 0.5, 0.8]).round(3)
    array([0.031, 0.232, 0.633])
    >>> np.unique(calibrator.predict(scores)).shape  # at most n_bins values
    (10,)
    """

    method = "scaling_binning"
    fitted_attributes = ("platt_a_", "platt_b_", "edges_", "values_", "bin_weights_")

    def __init__(self, input: str = "probability", n_bins: int = 10):
        self.input = input
        self.n_bins = n_bins

    def _check_params(self) -> None:
        check_n_bins(self.n_bins)

    def _platt(self) -> PlattCalibrator:
        platt = PlattCalibrator(input=self.input)
        platt.a_, platt.b_ = self.platt_a_, self.platt_b_
        return platt

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        platt = PlattCalibrator(input=self.input).fit(scores, labels, weights)
        self.platt_a_, self.platt_b_ = platt.a_, platt.b_
        self.edges_, self.values_, self.bin_weights_ = binned_means(platt._predict(scores), weights, int(self.n_bins))

    def _check_state(self) -> None:
        state_number(self.platt_a_, "platt_a_")
        state_number(self.platt_b_, "platt_b_")
        check_bins(self, (0.0, 1.0))  # the bins are over Platt's probabilities

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        g = self._platt()._predict(scores)
        return self.values_[np.searchsorted(self.edges_, g, side="left")]

    def fit_info(self) -> dict[str, Any]:
        return {
            "platt": {"a": self.platt_a_, "b": self.platt_b_},
            "n_bins": int(self.values_.shape[0]),
            "edges": self.edges_.tolist(),
            "values": self.values_.tolist(),
            "bin_weights": self.bin_weights_.tolist(),
        }
