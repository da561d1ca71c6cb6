"""One-vs-rest calibration: one binary calibrator per class, rows renormalised.

    s_ik = log(p_ik / (1 - p_ik)),   q_ik = g_k(s_ik),   p'_ik = q_ik / sum_j q_ij

For each class k, the binary calibrator g_k is fitted on the class's
one-vs-rest log-odds s_k against the labels 1[y = k]. Zadrozny & Elkan (2002),
"Transforming classifier scores into accurate multiclass probability
estimates" (one-vs-rest reduction, normalised by the sum); the per-class
calibrators are this package's ``platt`` (Platt 1999, sigmoid(A s + B)) and
``isotonic`` (pool-adjacent-violators), reused through their ``_fit`` and
``_predict``.

The per-class score is the same for both input kinds: the log-odds of p_k,
with p = softmax(z) for logits and the renormalised row for probabilities
(logits log(max(p, 1e-12)), so a class at probability 0 has log-odds of
about -27.6). It is computed stably from the logits (``one_vs_rest_logits``),
so a row with p_k = 1 - 1e-20 keeps its information. Platt on the log-odds is
the standard Platt scaling of p_k; isotonic is invariant to the monotone map
except for where it interpolates between blocks.

Rules:
* A class absent from the holdout (no row of it with positive weight) has
  nothing to calibrate against; its column keeps its input probability p_k
  (before renormalisation). ``calibrated_classes`` in the fit info lists the
  others.
* A row whose calibrated values are all 0 (isotonic can give 0 to every
  class of an unusual row) falls back to its input probabilities.
* Otherwise rows are divided by their sum, so they sum to 1; the result is
  not itself calibrated in any guaranteed sense (the classic objection to
  one-vs-rest), but it is what scikit-learn's CalibratedClassifierCV does.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ._multiclass import as_logits, check_packed, one_vs_rest_logits, pack_components, softmax, unpack_component
from .base import Calibrator
from .validation import check_min_probability
from .isotonic import IsotonicCalibrator
from .platt import PlattCalibrator


class _OneVsRestCalibrator(Calibrator):
    tasks = ("multiclass",)
    monotone = False
    #: The binary method fitted per class.
    component: ClassVar[type[Calibrator]]

    def _scores_and_probabilities(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = as_logits(scores, self.input)
        probabilities = scores if self.input == "probability" else softmax(z)
        return one_vs_rest_logits(z), probabilities

    def _component_options(self) -> dict[str, Any]:
        return {}

    def _check_state(self) -> None:
        names = self.component.fitted_attributes
        check_packed(self, self.component, "logit", names, "calibrated_", int(self.n_classes_), lambda part: part._check_state())

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        k = scores.shape[1]
        log_odds, _ = self._scores_and_probabilities(scores)
        present = np.bincount(labels[weights > 0], minlength=k) > 0
        components: list[Calibrator | None] = []
        for c in range(k):
            if not present[c]:
                components.append(None)
                continue
            component = self.component(input="logit", **self._component_options())
            component._fit(log_odds[:, c], (labels == c).astype(np.int8), weights)
            components.append(component)
        flat, self.offsets_ = pack_components(components, self.component.fitted_attributes)
        for name, values in flat.items():
            setattr(self, name, values)
        self.calibrated_ = present.astype(np.float64)

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        log_odds, probabilities = self._scores_and_probabilities(scores)
        names = self.component.fitted_attributes
        flat = {name: getattr(self, name) for name in names}
        calibrated = np.asarray(self.calibrated_) > 0.5
        out = probabilities.copy()
        for c in np.flatnonzero(calibrated):
            component = unpack_component(self.component, "logit", names, flat, self.offsets_, int(c))
            out[:, c] = component._predict(log_odds[:, c])
        total = out.sum(axis=1)
        empty = ~(total > 0)
        if empty.any():
            out[empty] = probabilities[empty]
            total[empty] = out[empty].sum(axis=1)
        out /= total[:, None]
        return out

    def fit_info(self) -> dict[str, Any]:
        calibrated = np.asarray(self.calibrated_) > 0.5
        return {
            "component": self.component.method,
            "score": "one-vs-rest log-odds",
            "calibrated_classes": np.flatnonzero(calibrated).tolist(),
            "uncalibrated_classes": np.flatnonzero(~calibrated).tolist(),
        }


class OneVsRestIsotonicCalibrator(_OneVsRestCalibrator):
    """One-vs-rest isotonic: p'_k = g_k(s_k) / sum_j g_j(s_j), g_k isotonic on the log-odds s_k of p_k.

    g_k is ``IsotonicCalibrator`` fitted on s_k = log(p_k / (1 - p_k)) against 1[y = k]. A class
    absent from the holdout keeps its input probability (before renormalising).

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (logit rows enter as p = softmax(z)).
    min_probability : float or None, default=None
        Each g_k is kept within [m, 1 - m]: None is m = 1 / (2 (n + 1)) for n holdout rows;
        0 keeps the raw block means.

    Attributes
    ----------
    calibrated_ : ndarray of shape (K,)
        1.0 for a class that has a g_k, 0.0 for a class absent from the holdout.
    offsets_ : ndarray of shape (K + 1, 2)
        Where each class's thresholds start and end in the two arrays below.
    x_thresholds_, y_thresholds_ : ndarray
        Every class's ``IsotonicCalibrator`` thresholds, one after the other.

    References
    ----------
    B. Zadrozny and C. Elkan, "Transforming classifier scores into accurate multiclass
    probability estimates", KDD 2002.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.one_vs_rest import OneVsRestIsotonicCalibrator
    >>> calibrator = OneVsRestIsotonicCalibrator(input="logit").fit(logits, labels)
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)  # the truth: 0.665, 0.245, 0.09
    array([[0.66 , 0.249, 0.09 ]])
    """

    method = "ovr_isotonic"
    component = IsotonicCalibrator
    fitted_attributes = ("calibrated_", "offsets_") + IsotonicCalibrator.fitted_attributes

    def __init__(self, input: str = "probability", min_probability: float | None = None):
        self.input = input
        self.min_probability = min_probability

    def _check_params(self) -> None:
        check_min_probability(self.min_probability)

    def _component_options(self) -> dict[str, Any]:
        # Each class's part kept within [m, 1 - m] (isotonic's option), so that no row renormalises to a 0.
        return {"min_probability": self.min_probability}


class OneVsRestPlattCalibrator(_OneVsRestCalibrator):
    """One-vs-rest Platt: p'_k = q_k / sum_j q_j, q_k = sigmoid(A_k s_k + B_k), s_k the log-odds of p_k.

    (A_k, B_k) is ``PlattCalibrator`` fitted on s_k = log(p_k / (1 - p_k)) against 1[y = k]. A
    class absent from the holdout keeps its input probability (before renormalising).

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (logit rows enter as p = softmax(z)).

    Attributes
    ----------
    calibrated_ : ndarray of shape (K,)
        1.0 for a class that has a Platt fit, 0.0 for a class absent from the holdout.
    offsets_ : ndarray of shape (K + 1, 2)
        Where each class's entry starts and ends in ``a_`` and ``b_``.
    a_, b_ : ndarray
        The fitted classes' A_k and B_k.

    References
    ----------
    B. Zadrozny and C. Elkan, "Transforming classifier scores into accurate multiclass
    probability estimates", KDD 2002; J. Platt, "Probabilistic outputs for support vector
    machines and comparisons to regularized likelihood methods", 1999.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.one_vs_rest import OneVsRestPlattCalibrator
    >>> calibrator = OneVsRestPlattCalibrator(input="logit").fit(logits, labels)
    >>> calibrator.a_.round(2)  # about 1 / T = 0.5
    array([0.48, 0.51, 0.47])
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)  # the truth: 0.665, 0.245, 0.09
    array([[0.677, 0.239, 0.084]])
    """

    method = "ovr_platt"
    component = PlattCalibrator
    fitted_attributes = ("calibrated_", "offsets_") + PlattCalibrator.fitted_attributes
