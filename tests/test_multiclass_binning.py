"""One-vs-rest and top-label histogram calibrators on small hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from calibd.calibration.one_vs_rest import OneVsRestIsotonicCalibrator, OneVsRestPlattCalibrator
from calibd.calibration.top_label_histogram import TopLabelHistogramCalibrator

# Five rows, each twice; the per-class columns have no ties between different rows.
ROWS = np.array(
    [
        [0.70, 0.20, 0.10],
        [0.60, 0.25, 0.15],
        [0.30, 0.50, 0.20],
        [0.15, 0.35, 0.50],
        [0.05, 0.40, 0.55],
    ]
)
LABELS = np.array([0, 1, 1, 2, 0])


def test_ovr_isotonic_by_hand():
    scores, labels = np.repeat(ROWS, 2, axis=0), np.repeat(LABELS, 2)
    calibrator = OneVsRestIsotonicCalibrator(min_probability=0).fit(scores, labels)
    # Per class, sorted by p_k, the indicators 1[y = k] and their PAV fit:
    #   class 0: p .05 .15 .30 .60 .70 -> 1 0 0 0 1 -> 1/4 1/4 1/4 1/4 1
    #   class 1: p .20 .25 .35 .40 .50 -> 0 1 0 0 1 -> 0 1/3 1/3 1/3 1
    #   class 2: p .10 .15 .20 .50 .55 -> 0 0 0 1 0 -> 0 0 0 1/2 1/2
    # so the rows get q = (1, 0, 0), (1/4, 1/3, 0), (1/4, 1, 0), (1/4, 1/3, 1/2), (1/4, 1/3, 1/2),
    # divided by their sums.
    expected = np.array(
        [[1, 0, 0], [3 / 7, 4 / 7, 0], [1 / 5, 4 / 5, 0], [3 / 13, 4 / 13, 6 / 13], [3 / 13, 4 / 13, 6 / 13]]
    )
    np.testing.assert_allclose(calibrator.predict(ROWS), expected, atol=1e-12)
    # The same through logits: the per-class score is the one-vs-rest log-odds either way.
    on_logits = OneVsRestIsotonicCalibrator(min_probability=0, input="logit").fit(np.log(scores) + 3.0, labels)
    np.testing.assert_allclose(on_logits.predict(np.log(ROWS) - 1.0), expected, atol=1e-9)


def test_ovr_isotonic_row_of_zeros_falls_back_to_the_input_probabilities():
    scores, labels = np.repeat(ROWS, 2, axis=0), np.repeat(LABELS, 2)
    calibrator = OneVsRestIsotonicCalibrator(min_probability=0).fit(scores, labels)
    calibrator.y_thresholds_ = np.zeros_like(calibrator.y_thresholds_)  # every class says 0
    np.testing.assert_allclose(calibrator.predict(ROWS), ROWS, atol=1e-15)


def test_ovr_platt_matches_per_class_logistic_regression_on_the_log_odds():
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, (3000, 4))
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    y = np.minimum((p.cumsum(axis=1) < rng.uniform(size=(3000, 1))).sum(axis=1), 3)
    sharp = np.exp(2 * z) / np.exp(2 * z).sum(axis=1, keepdims=True)  # overconfident scores
    ours = OneVsRestPlattCalibrator().fit(sharp, y).predict(sharp[:200])
    q = np.empty((200, 4))
    for k in range(4):
        feature = np.log(sharp[:, k] / (1 - sharp[:, k]))[:, None]
        reference = LogisticRegression(C=1e12, tol=1e-12, max_iter=10_000).fit(feature, y == k)
        q[:, k] = reference.predict_proba(feature[:200])[:, 1]
    np.testing.assert_allclose(ours, q / q.sum(axis=1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("cls", [OneVsRestIsotonicCalibrator, OneVsRestPlattCalibrator])
def test_ovr_class_absent_from_the_holdout_keeps_its_input_probability(cls):
    rng = np.random.default_rng(1)
    p = rng.dirichlet([2, 2, 2], 400)
    y = (p[:, 1] > p[:, 0]).astype(int)  # class 2 never occurs
    calibrator = cls().fit(p, y)
    assert calibrator.fit_info()["uncalibrated_classes"] == [2]
    # Classes 0 and 1: the binary method on their log-odds; class 2: its input probability.
    log_odds = np.log(p / (1 - p))
    q = p.copy()
    for k in (0, 1):
        component = cls.component(input="logit")
        component._fit(log_odds[:, k], (y == k).astype(np.int8), np.ones(400))
        q[:, k] = component._predict(log_odds[:, k])
    np.testing.assert_allclose(calibrator.predict(p), q / q.sum(axis=1, keepdims=True), atol=1e-9)


TOP_ROWS = np.array(
    [
        [0.6, 0.3, 0.1],  # predicted 0, y 0
        [0.7, 0.2, 0.1],  # predicted 0, y 0
        [0.8, 0.1, 0.1],  # predicted 0, y 1
        [0.5, 0.3, 0.2],  # predicted 0, y 0
        [0.9, 0.05, 0.05],  # predicted 0, y 0
        [0.2, 0.7, 0.1],  # predicted 1, y 1
        [0.3, 0.6, 0.1],  # predicted 1, y 0
        [0.1, 0.8, 0.1],  # predicted 1, y 1
        [0.2, 0.5, 0.3],  # predicted 1, y 2
        [0.1, 0.2, 0.7],  # predicted 2, y 2 (the only row predicted 2)
    ]
)
TOP_LABELS = np.array([0, 0, 1, 0, 0, 1, 0, 1, 2, 2])


def test_top_label_histogram_one_bin_per_class_by_hand():
    calibrator = TopLabelHistogramCalibrator(min_probability=0, n_bins=1, points_per_bin=2, prior_strength=0.0).fit(TOP_ROWS, TOP_LABELS)
    # Predicted 0: 4 of 5 right -> 0.8. Predicted 1: 2 of 4 -> 0.5. Predicted 2 has 1 row (< 2):
    # the pooled binning of all rows, 7 of 10 right -> 0.7.
    info = calibrator.fit_info()
    assert info["classes_with_own_binning"] == [0, 1] and info["pooled_bins"] == 1
    query = np.array([[0.6, 0.3, 0.1], [0.2, 0.45, 0.35], [0.1, 0.3, 0.6], [1.0, 0.0, 0.0]])
    expected = np.array(
        [
            [0.8, 0.2 * 0.3 / 0.4, 0.2 * 0.1 / 0.4],  # the rest in proportion to the input
            [0.5 * 0.2 / 0.55, 0.5, 0.5 * 0.35 / 0.55],
            [0.3 * 0.1 / 0.4, 0.3 * 0.3 / 0.4, 0.7],  # pooled fallback
            [0.8, 0.1, 0.1],  # no other mass: the rest evenly
        ]
    )
    np.testing.assert_allclose(calibrator.predict(query), expected, atol=1e-12)


def test_top_label_histogram_bins_the_confidence_within_a_class():
    # Class 0's five confidences .5 .6 .7 .8 .9 in 2 equal-mass bins: the edge is at .8
    # (halfway goes up), so [.5, .8) has 3 of 3 right and [.8, .9] 1 of 2.
    calibrator = TopLabelHistogramCalibrator(min_probability=0, n_bins=2, points_per_bin=2, prior_strength=0.0).fit(TOP_ROWS, TOP_LABELS)
    out = calibrator.predict(np.array([[0.65, 0.25, 0.1], [0.85, 0.1, 0.05]]))
    np.testing.assert_allclose(out, [[1.0, 0.0, 0.0], [0.5, 0.5 * 0.1 / 0.15, 0.5 * 0.05 / 0.15]], atol=1e-12)
    # The Beta prior pulls a bin toward the class's accuracy 4/5: (3 + 2 * 0.8) / (3 + 2).
    shrunk = TopLabelHistogramCalibrator(min_probability=0, n_bins=2, points_per_bin=2, prior_strength=2.0).fit(TOP_ROWS, TOP_LABELS)
    assert shrunk.predict(np.array([[0.65, 0.25, 0.1]]))[0, 0] == pytest.approx(4.6 / 5)


def test_top_label_histogram_ties_and_logits():
    on_logits = TopLabelHistogramCalibrator(min_probability=0, input="logit", n_bins=1, points_per_bin=2, prior_strength=0.0)
    on_logits.fit(np.log(TOP_ROWS) + 5.0, TOP_LABELS)
    on_probabilities = TopLabelHistogramCalibrator(min_probability=0, n_bins=1, points_per_bin=2, prior_strength=0.0).fit(TOP_ROWS, TOP_LABELS)
    query = np.array([[0.6, 0.3, 0.1], [0.1, 0.3, 0.6]])
    np.testing.assert_allclose(on_logits.predict(np.log(query)), on_probabilities.predict(query), atol=1e-12)
    # A tie for the top goes to the lowest index: class 0 here, whose accuracy is 0.8.
    tied = on_probabilities.predict(np.array([[0.45, 0.45, 0.1]]))
    np.testing.assert_allclose(tied, [[0.8, 0.2 * 0.45 / 0.55, 0.2 * 0.1 / 0.55]], atol=1e-12)
