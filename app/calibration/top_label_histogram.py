"""Top-label histogram binning: calibrate the confidence of the predicted class,
separately for each predicted class.

Gupta & Ramdas (2022), "Top-label calibration and multiclass-to-binary
reductions" (ICLR), Algorithm 2 (top-label histogram binning). With
c(x) = argmax_k p_k(x) and the confidence t(x) = max_k p_k(x), for each class c
the holdout rows predicted c are binned by equal mass on t, and

    h(x) = (sum_{i in bin(x), c(x_i) = c(x)} w_i 1[y_i = c(x)] + S r_c) / (sum w_i + S)

the bin's weighted accuracy, shrunk toward r_c, the accuracy of all rows
predicted c, by a Beta prior of weight S = ``prior_strength`` (S = 0 gives the
paper's plain bin mean; the default S = 2 keeps a small bin from saying exactly
0 or 1). The binning and shrinkage are this package's ``histogram``
calibrator (``HistogramCalibrator``: equal-mass edges, left-closed bins),
fitted per predicted class on (t, 1[y = c]).

The paper's number of bins follows from a number of points per bin; here a
class predicted on n_c holdout rows gets min(n_bins, floor(n_c /
points_per_bin)) bins. A predicted class with fewer than ``points_per_bin``
rows (including classes never predicted on the holdout) has no binning of its
own: it shares a pooled fallback, the same top-label binning fitted on all
holdout rows regardless of predicted class (min(n_bins, floor(n /
points_per_bin)) bins, at least 1), i.e. plain top-label confidence
calibration.

The output is a full row: the predicted class gets h(x) and the remaining
mass 1 - h(x) is spread over the other classes in proportion to their input
probabilities, p'_j = (1 - h) p_j / (1 - t) for j != c(x); when the other
classes have no probability at all (t = 1) the rest is spread evenly. Rows
sum to 1. When h(x) is small the predicted class may no longer be the
largest entry of the output: the method calibrates the confidence of the
input's top class, not the output's argmax. Ties for the top class go to the
lowest class index. Probabilities come from softmax for logit input.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np

from ._multiclass import as_probabilities, check_packed, pack_components, unpack_component
from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import state_array
from .histogram import HistogramCalibrator, check_n_bins


class TopLabelHistogramCalibrator(Calibrator):
    """Top-label histogram binning: p'_c = h_c(t), c = argmax p, t = max p; the rest in proportion.

    h_c is ``HistogramCalibrator`` fitted on (t, 1[y = c]) over the holdout rows predicted c, with
    min(n_bins, n_c // points_per_bin) bins; a class predicted on fewer than ``points_per_bin``
    rows uses the same binning fitted on all rows. The other classes share 1 - h_c(t) in
    proportion to their input probabilities, so rows sum to 1.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (logit rows enter as p = softmax(z)).
    n_bins : int, default=15
        The most equal-mass bins per predicted class, 1 to 1000.
    points_per_bin : int, default=50
        Holdout rows per bin, 1 to 1000000.
    prior_strength : float, default=2.0
        S, the weight of each bin's Beta prior toward the class's accuracy; 0 gives the
        plain bin means.
    min_probability : float or None, default=None
        Each histogram's values are kept within [m, 1 - m]: None is m = 1 / (2 (n + 1)) for
        its n rows; 0 keeps the raw means.

    Attributes
    ----------
    own_binning_ : ndarray of shape (K,)
        1.0 for a class with a binning of its own, 0.0 for one that uses the pooled binning.
    offsets_ : ndarray of shape (K + 2, 2)
        Where each binning (the K classes', then the pooled one) starts and ends in the two
        arrays below.
    edges_, values_ : ndarray
        Every binning's ``HistogramCalibrator`` edges and values, one after the other.

    References
    ----------
    C. Gupta and A. Ramdas, "Top-label calibration and multiclass-to-binary reductions",
    ICLR 2022 (Algorithm 2).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.top_label_histogram import TopLabelHistogramCalibrator
    >>> calibrator = TopLabelHistogramCalibrator(input="logit").fit(logits, labels)
    >>> calibrator.own_binning_
    array([1., 1., 1.])
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)  # the truth: 0.665, 0.245, 0.09
    array([[0.595, 0.357, 0.048]])
    """

    method = "top_label_histogram"
    tasks = ("multiclass",)
    monotone = False
    fitted_attributes = ("own_binning_", "offsets_", "edges_", "values_")

    def __init__(
        self,
        input: str = "probability",
        n_bins: int = 15,
        points_per_bin: int = 50,
        prior_strength: float = 2.0,
        min_probability: float | None = None,
    ):
        self.input = input
        self.n_bins = n_bins
        self.points_per_bin = points_per_bin
        self.prior_strength = prior_strength
        self.min_probability = min_probability

    def _check_params(self) -> None:
        check_n_bins(self.n_bins)
        p = self.points_per_bin
        if isinstance(p, bool) or not isinstance(p, Integral) or not 1 <= p <= 1_000_000:
            raise CalibrationInputError("options.points_per_bin", "must be an integer from 1 to 1000000")
        HistogramCalibrator(prior_strength=self.prior_strength, min_probability=self.min_probability)._check_params()

    def _histogram(self, confidence: np.ndarray, correct: np.ndarray, weights: np.ndarray) -> HistogramCalibrator:
        n_bins = max(1, min(int(self.n_bins), confidence.shape[0] // int(self.points_per_bin)))
        histogram = HistogramCalibrator(
            input="probability", n_bins=n_bins, prior_strength=self.prior_strength, min_probability=self.min_probability
        )
        histogram._fit(confidence, correct, weights)
        return histogram

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        k = scores.shape[1]
        p = as_probabilities(scores, self.input)
        predicted = p.argmax(axis=1)
        confidence = p.max(axis=1)
        correct = (labels == predicted).astype(np.int8)
        # Rows with zero weight do not count toward a class's own binning.
        counts = np.bincount(predicted[weights > 0], minlength=k)
        components: list[HistogramCalibrator | None] = []
        for c in range(k):
            if counts[c] < int(self.points_per_bin):
                components.append(None)
                continue
            rows = (predicted == c) & (weights > 0)
            components.append(self._histogram(confidence[rows], correct[rows], weights[rows]))
        keep = weights > 0
        components.append(self._histogram(confidence[keep], correct[keep], weights[keep]))  # the pooled fallback
        flat, self.offsets_ = pack_components(components, ("edges_", "values_"))
        self.edges_, self.values_ = flat["edges_"], flat["values_"]
        self.own_binning_ = np.array([c is not None for c in components[:k]], dtype=np.float64)

    def _check_state(self) -> None:
        def check_histogram(part: Calibrator) -> None:
            edges = state_array(part.edges_, "edges_", within=(0.0, 1.0), non_decreasing=True)
            state_array(part.values_, "values_", shape=(edges.shape[0] + 1,), within=(0.0, 1.0))

        # A histogram per class, then the pooled one that every row may fall back to.
        k = int(self.n_classes_)
        check_packed(self, HistogramCalibrator, "probability", ("edges_", "values_"), "own_binning_", k + 1, check_histogram)
        if not np.diff(self.offsets_[-2:, 1]).all():
            raise CalibrationInputError("state.offsets_", "the pooled histogram (the last part) must not be empty")

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        p = as_probabilities(scores, self.input)
        n, k = p.shape
        rows = np.arange(n)
        predicted = p.argmax(axis=1)
        confidence = p[rows, predicted]
        own = np.asarray(self.own_binning_) > 0.5
        component_of_row = np.where(own[predicted], predicted, k)  # k: the pooled fallback
        names = ("edges_", "values_")
        flat = {"edges_": self.edges_, "values_": self.values_}
        top = np.empty(n)
        for c in np.unique(component_of_row):
            members = component_of_row == c
            histogram = unpack_component(HistogramCalibrator, "probability", names, flat, self.offsets_, int(c))
            top[members] = histogram._predict(confidence[members])
        out = p.copy()
        out[rows, predicted] = 0.0
        # The other classes' input mass, summed directly (1 - t would cancel when t is near 1).
        rest = out.sum(axis=1)
        spread = rest > 0
        # The others in proportion to their input probabilities ...
        out[spread] *= ((1.0 - top[spread]) / rest[spread])[:, None]
        # ... or evenly when they have none.
        out[~spread] = ((1.0 - top[~spread]) / (k - 1))[:, None]
        out[rows, predicted] = top
        return out

    def fit_info(self) -> dict[str, Any]:
        own = np.asarray(self.own_binning_) > 0.5
        offsets = np.asarray(self.offsets_, dtype=np.int64)
        bins = np.diff(offsets[:, 1])  # values per component = bins
        return {
            "classes_with_own_binning": np.flatnonzero(own).tolist(),
            "bins_per_class": [int(b) if o else None for b, o in zip(bins[:-1], own)],
            "pooled_bins": int(bins[-1]),
            "points_per_bin": int(self.points_per_bin),
        }
