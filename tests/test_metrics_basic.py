"""Hand-computed cases for the fit-summary metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibd.metrics import brier, ece, log_loss


def test_ece_by_hand():
    # Two uniform bins: [0, 0.5) holds 0.1, 0.2 (labels 0, 1), [0.5, 1] holds 0.7, 1.0 (labels 1, 1).
    p = [0.1, 0.2, 0.7, 1.0]
    y = [0, 1, 1, 1]
    # bin 1: |0.5 - 0.15| = 0.35; bin 2: |1 - 0.85| = 0.15; each holds half the mass.
    assert ece(p, y, n_bins=2) == pytest.approx(0.25)
    assert ece(p, y, n_bins=2, norm="max") == pytest.approx(0.35)
    assert ece(p, y, n_bins=2, norm="l2") == pytest.approx(math.sqrt((0.35**2 + 0.15**2) / 2))


def test_ece_bins_are_left_closed_and_one_falls_in_the_last_bin():
    # 0.5 sits on an edge: it belongs to [0.5, 1]; so does 1.0.
    assert ece([0.5, 1.0], [1, 1], n_bins=2) == pytest.approx(0.25)
    assert ece([1.0], [1], n_bins=15) == 0.0


def test_ece_weights_count_as_multiplicities():
    p = np.array([0.1, 0.2, 0.7])
    y = np.array([0, 1, 1])
    repeated = ece(np.repeat(p, [2, 1, 3]), np.repeat(y, [2, 1, 3]), n_bins=2)
    assert ece(p, y, n_bins=2, sample_weight=[2, 1, 3]) == pytest.approx(repeated)


def test_brier_and_log_loss_by_hand():
    p = [0.2, 0.9]
    y = [0, 1]
    assert brier(p, y) == pytest.approx((0.04 + 0.01) / 2)
    assert log_loss(p, y) == pytest.approx(-(math.log(0.8) + math.log(0.9)) / 2)
    assert math.isfinite(log_loss([0.0], [1]))
