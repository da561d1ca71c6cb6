"""multicalibration on a small draw of each synthetic case of the benchmark suite (tests/segment_cases.py).

On rows it did not see: the worst segment's evidence of miscalibration (MCE sigma) falls below the
input's, and the log loss is not worse than the input's. On the already multicalibrated case there is
nothing to fix: nothing may get worse (log loss within 0.001 of the input's, MCE sigma within noise
of the truth's). Numeric columns enter the MCE as quartile categories.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration.multicalibration import MulticalibrationCalibrator
from calibd.metrics import log_loss
from calibd.metrics.multicalibration import multicalibration_error
from tests.segment_cases import CASES, Case

N = 10_000
#: Rows where the default's would hold too few of the case's segments to tell from noise (0.3% of 10,000 is 30).
ROWS = {"rare_segments": 40_000}


def features(case: Case) -> dict[str, list]:
    return {**{k: v.tolist() for k, v in case.categorical.items()}, **{k: v.tolist() for k, v in case.numeric.items()}}


def mce_sigma(p: np.ndarray, case: Case, edges: dict[str, np.ndarray]) -> float:
    segments = {k: v.astype(object) for k, v in case.categorical.items()}
    segments |= {k: np.digitize(v, edges[k]).astype(str).astype(object) for k, v in case.numeric.items()}
    return multicalibration_error(p, case.y, None, segments)["mce_sigma"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_multicalibration_lowers_the_worst_segment_without_losing_log_loss(name):
    n = ROWS.get(name, N)
    whole = CASES[name](2 * n, np.random.default_rng(7))
    train, test = whole.take(np.arange(n)), whole.take(np.arange(n, 2 * n))
    edges = {k: np.quantile(v, [0.25, 0.5, 0.75]) for k, v in train.numeric.items()}
    model = MulticalibrationCalibrator().fit(train.score, train.y, features=features(train))
    p = model.predict(test.score, features=features(test))
    before, after = mce_sigma(test.score, test, edges), mce_sigma(p, test, edges)
    if name == "calibrated":  # the input is the truth: nothing to fix, nothing may get worse
        assert log_loss(p, test.y) <= log_loss(test.score, test.y) + 0.001
        assert after <= mce_sigma(test.truth, test, edges) + 1.0
    else:
        assert after < before, (after, before)
        assert log_loss(p, test.y) <= log_loss(test.score, test.y)
