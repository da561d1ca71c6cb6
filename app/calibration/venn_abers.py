"""Inductive Venn-Abers predictor: two isotonic fits per test score, and their merge.

For a test score s, with the holdout's isotonic regression f (exact ties pooled,
evaluated as a step function, no interpolation):

    p0(s) = f_{holdout + (s, 0)}(s),   p1(s) = f_{holdout + (s, 1)}(s)
    p(s)  = p1 / (1 - p0 + p1)

[p0, p1] is the multiprobability prediction (one of them is calibrated in
Venn's sense); p is the merge that minimises the worst-case log-loss regret.
Vovk & Petej (2014), "Venn-Abers predictors"; the O(n log n) algorithm is from
Vovk, Petej & Fedorova (2015), "Large-scale probabilistic predictors with and
without guarantees of validity".

Precomputation. Sort the holdout, pool ties into k groups (weight W_j,
positive weight C_j), and draw the cumulative sum diagram P_j = (X_j, Y_j) =
(W_1 + ... + W_j, C_1 + ... + C_j), P_0 = (0, 0). An isotonic value is the
slope of the diagram's greatest convex minorant (its lower hull) over that
point's span. Inserting (s, 1) with weight 1 after g groups is, after
shifting the points left of it by (-1, -1), the point set
{P_a - (1, 1) : a <= g} + {P_b : b >= g}, and p1 is the hull's slope over
(X_g - 1, X_g). Going from g to g + 1 adds Q = P_{g+1} - (1, 1) and drops
P_g; but P_g lies on or above a chord between points that are still there
(P_{g+1} - (1, 1) and P_g - (1, 1) or P_{g+1}, because C/W <= 1), so it can
stay without changing the hull. The sweep therefore only ever adds a point,
each one to the right of the previous, and keeps on a stack the hull from
the last vertex left of the query onwards: amortised O(k) after the
O(n log n) sort (a Python loop over the k distinct scores at fit time; the
starting hull comes from SciPy's PAV). p0 is the same computation on the
mirrored problem (scores reversed, labels flipped, p0 = 1 - p1). The argument
holds for any positive weights, not only integer multiplicities.

Ties. A test score equal to a holdout score joins that tie group. With label
1 that gives the same value as inserting it just below the group (the
group's own point lies above the chord that replaces it), with label 0 the
same as just above. So with g_lo = #{holdout scores < s} and g_hi =
#{holdout scores <= s}, p1 = p1_[g_lo] and p0 = p0_[g_hi], the tables being
indexed by the insertion position g = 0..k; for a score strictly between
(or outside) the holdout scores g_lo = g_hi. Prediction is one searchsorted,
an equality test and two gathers.

Monotone. An inserted point's isotonic value does not decrease when it moves
past a holdout group (any block around it stays available, with that group
on its left instead of its right), so p0_ and p1_ are non-decreasing, and
p1 / (1 - p0 + p1) is non-decreasing in both p0 and p1: the point estimate
is a non-decreasing step function of the score (``monotone = True``). It is
computed as 1 / (1 + (1 - p0) / p1) so that this also holds in floating
point (p1 > 0: its block contains the inserted positive).

Weights are multiplicities: a holdout row with weight w counts as w copies;
the inserted test point has weight 1, so weights should be in units of rows
(weights normalised to sum to 1 would let one test point outweigh the whole
holdout). Only the order of the scores matters, so probability and logit
inputs give the same fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import state_array
from .isotonic import pool_ties


def _inserted_positive_values(weights: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """Isotonic value of a (weight 1, label 1) point inserted after g groups, g = 0..k.

    ``weights`` and ``positives`` are the groups' total and positive weights, in
    ascending score order.
    """
    # Cumulative sum diagram with Q_0 = P_0 - (1, 1) in front: index 0 is Q_0,
    # index m >= 1 is P_{m-1}.
    xs = np.concatenate(([-1.0, 0.0], np.cumsum(weights)))
    ys = np.concatenate(([-1.0, 0.0], np.cumsum(positives)))
    # The starting hull, of {Q_0} + {P_0 .. P_k}, is the diagram of the inserted
    # point followed by the groups, whose vertices are PAV's block boundaries.
    blocks = isotonic_regression(
        np.concatenate(([1.0], positives / weights)), weights=np.concatenate(([1.0], weights))
    ).blocks
    # The stack holds hull vertices as (x, y), the leftmost one last.
    hull = list(zip(xs[blocks][::-1].tolist(), ys[blocks][::-1].tolist()))
    pop, push = hull.pop, hull.append
    (tx, ty), (nx, ny) = hull[-1], hull[-2]
    out = [(ny - ty) / (nx - tx)]
    # Step g inserts Q_g = P_g - (1, 1) and reads the slope over (X_g - 1, X_g).
    for px, py in zip(xs[2:].tolist(), ys[2:].tolist()):
        qx, qy = px - 1.0, py - 1.0
        # Vertices left of Q matter for no later query or insertion (all lie
        # further right), except the last one, whose segment spans Q.
        while hull[-2][0] <= qx:
            pop()
        (tx, ty), (nx, ny) = hull[-1], hull[-2]
        if (nx - tx) * (qy - ty) < (ny - ty) * (qx - tx):
            # Q lies below the hull, so it becomes a vertex and everything left
            # of it is irrelevant from now on. Pop the vertices it hides.
            pop()
            while len(hull) >= 2:
                (ax, ay), (bx, by) = hull[-1], hull[-2]
                if (ax - qx) * (by - ay) > (ay - qy) * (bx - ax):
                    break  # Q -> A -> B turns left: A stays a vertex
                pop()
            push((qx, qy))
        # A vertex inside (X_g - 1, X_g) can only be a dropped P_b (b < g),
        # which is at best collinear with the hull; skipping it keeps the
        # slope's run >= 1, so that rounding is never divided by a tiny run.
        while hull[-2][0] < px:
            del hull[-2]
        (tx, ty), (nx, ny) = hull[-1], hull[-2]
        out.append((ny - ty) / (nx - tx))
    return np.array(out)


class VennAbersCalibrator(Calibrator):
    """Inductive Venn-Abers predictor: p(s) = p1 / (1 - p0 + p1), [p0, p1] the isotonic values at s.

    p0 (p1) is the isotonic regression's value at s when the holdout is extended by (s, 0)
    (by (s, 1)), as a step function; both are tabulated at fit time for every position a
    test score can take. ``predict_details`` also returns the interval [p0, p1] per score.
    Sample weights count as multiplicities (the test point weighs 1).

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (only their order matters).

    Attributes
    ----------
    scores_ : ndarray of shape (k,)
        The distinct holdout scores, increasing.
    p0_ : ndarray of shape (k + 1,)
        p0 for a test score below, between or above them (index: holdout scores below it).
    p1_ : ndarray of shape (k + 1,)
        p1, indexed as ``p0_``.

    References
    ----------
    V. Vovk and I. Petej, "Venn-Abers predictors", UAI 2014; the O(n log n) fit:
    V. Vovk, I. Petej and V. Fedorova, "Large-scale probabilistic predictors with and
    without guarantees of validity", NeurIPS 2015.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.venn_abers import VennAbersCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = VennAbersCalibrator().fit(scores, labels)
    >>> probabilities, extras = calibrator.predict_details([0.2, 0.5, 0.8])
    >>> probabilities.round(3)
    array([0.049, 0.194, 0.732])
    >>> extras["intervals"].round(3)  # [p0, p1] per score
    array([[0.   , 0.051],
           [0.171, 0.2  ],
           [0.7  , 0.818]])
    """

    method = "venn_abers"
    # The fit builds its tables in a Python loop over distinct scores (about 1.4 s per million).
    max_samples = 2_000_000
    monotone = True
    fitted_attributes = ("scores_", "p0_", "p1_")

    def _check_state(self) -> None:
        x = state_array(self.scores_, "scores_", within=(0.0, 1.0) if self.input == "probability" else None, non_decreasing=True)
        if not x.shape[0]:
            raise CalibrationInputError("state.scores_", "must not be empty")
        for name in ("p0_", "p1_"):  # one value more than scores: below, between and above them
            state_array(getattr(self, name), name, shape=(x.shape[0] + 1,), within=(0.0, 1.0), non_decreasing=True)

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        x, total, positive, negative = pool_ties(scores, labels, weights)
        p1 = _inserted_positive_values(total, positive)
        # Mirror: reversed order, labels flipped; an inserted 0 becomes an inserted 1.
        p0 = 1.0 - _inserted_positive_values(total[::-1], negative[::-1])[::-1]
        # In exact arithmetic both tables are non-decreasing, within [0, 1] and
        # p0 <= p1 at every position a test score can take (p1[g] and p0[g],
        # and for a tie p1[g] and p0[g + 1]); these lines only undo rounding.
        p1 = np.maximum.accumulate(np.clip(p1, 0.0, 1.0))
        p0 = np.maximum.accumulate(np.clip(p0, 0.0, 1.0))
        p0 = np.minimum(p0, np.concatenate(([p1[0]], p1[:-1])))
        self.scores_, self.p0_, self.p1_ = x, p0, p1

    def _intervals(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        below = np.searchsorted(self.scores_, scores, side="left")
        # A score equal to a holdout score is pooled with that group: its p1 is
        # the value just below the group and its p0 the value just above.
        tied = self.scores_[np.minimum(below, self.scores_.shape[0] - 1)] == scores
        return self.p0_[below + tied], self.p1_[below]

    @staticmethod
    def _merge(p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
        # = p1 / (1 - p0 + p1), written with monotone operations only. p1 > 0
        # unless the holdout weight dwarfs the inserted point's 1 (then p = 0).
        with np.errstate(divide="ignore"):
            return 1.0 / (1.0 + (1.0 - p0) / p1)

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return self._merge(*self._intervals(scores))

    def _predict_details(self, scores: np.ndarray, **arrays: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        p0, p1 = self._intervals(scores)
        return self._merge(p0, p1), {"intervals": np.column_stack([p0, p1])}

    def fit_info(self) -> dict[str, Any]:
        x, p0, p1 = self.scores_, self.p0_, self.p1_
        # Every (p0, p1) pair a test score can get: between holdout scores or
        # outside them (same index), or tied with one (p1 below, p0 above).
        widths = np.concatenate((p1 - p0, p1[:-1] - p0[1:]))
        return {
            "n_distinct_scores": int(x.shape[0]),
            "score_range": [float(x[0]), float(x[-1])],
            "interval_width": {"min": float(widths.min()), "max": float(widths.max())},
            "p0_range": [float(p0[0]), float(p0[-1])],
            "p1_range": [float(p1[0]), float(p1[-1])],
        }
