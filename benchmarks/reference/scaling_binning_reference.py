"""Reference outputs of PyPI ``uncertainty-calibration`` for tests/test_scaling_binning.py.

Kumar, Liang & Ma's own implementation of the scaling-binning calibrator,
``calibration.PlattBinnerCalibrator``. Not part of calibd and not one of its
dependencies. Run it in a scratch virtualenv:

    python3 -m venv /tmp/ref-venv
    /tmp/ref-venv/bin/pip install uncertainty-calibration scikit-learn
    /tmp/ref-venv/bin/python benchmarks/reference/scaling_binning_reference.py

It prints a Python literal; tests/test_scaling_binning.py holds a copy as
SCALING_BINNING_REFERENCE (produced with uncertainty-calibration 0.1.4,
scikit-learn 1.9.1, numpy 2.4.6). Data as in betacal_reference.py: no random
generator, so the test rebuilds them bit for bit.
"""

from __future__ import annotations

from importlib.metadata import version
from pprint import pformat

import numpy as np

PHI = (1.0 + 5.0**0.5) / 2.0
GRID = [0.001, 0.01, 0.03, 0.07, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.93, 0.97, 0.99, 0.999]

# name: (n, n_bins, decimals the scores are rounded to (None: not rounded),
#        true a, b, c of P(y = 1 | p) = sigmoid(a ln p - b ln(1 - p) + c))
CASES = {
    "n400_bins10": (400, 10, None, 1.6, 0.7, 0.4),
    "n103_bins7": (103, 7, None, 0.8, 1.3, -0.2),  # runs of 15 and 14 points
    "ties_bins15": (200, 15, 1, 1.6, 0.7, 0.4),  # 11 distinct scores: 10 bins
    "ties_empty_bins": (100, 30, 1, 1.6, 0.7, 0.4),  # runs of 3 or 4 within ties: 14 bins, 3 empty
}


def reference_data(n: int, a: float, b: float, c: float, decimals: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scores in (0.0005, 0.9995) and 0/1 labels drawn from a beta map, deterministically."""
    i = np.arange(1, n + 1, dtype=np.float64)
    p = 0.0005 + 0.999 * np.mod(i * 2.0**0.5, 1.0)
    if decimals is not None:
        p = np.clip(np.round(p, decimals), 0.05, 0.95)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log1p(-p) + c)))
    labels = (np.mod(i * PHI, 1.0) < truth).astype(np.int64)
    return p, labels


def main() -> None:
    from calibration import PlattBinnerCalibrator, utils

    out = {"versions": {name: version(name) for name in ("uncertainty-calibration", "scikit-learn", "numpy")}}
    for name, (n, n_bins, decimals, a, b, c) in CASES.items():
        scores, labels = reference_data(n, a, b, c, decimals)
        calibrator = PlattBinnerCalibrator(num_calibration=n, num_bins=n_bins)
        calibrator.train_calibration(scores, labels)
        _, clf = utils.get_platt_scaler(scores, labels, get_clf=True)  # the same fit, to read A and B
        bins = utils.get_equal_bins(calibrator._platt(scores), num_bins=n_bins)
        # A bin's upper edge lies in that bin (searchsorted, side="left"): its value.
        values = calibrator._discrete_calibrator(np.asarray(bins))
        out[name] = {
            "data": [n, a, b, c, decimals],
            "n_bins": n_bins,
            "platt_a": float(clf.coef_[0][0]),
            "platt_b": float(clf.intercept_[0]),
            "bins": [float(v) for v in bins],
            "values": [float(v) for v in values],
            "grid": GRID,
            "predictions": [float(v) for v in calibrator.calibrate(np.asarray(GRID))],
        }
    print(pformat(out, width=110, sort_dicts=False))


if __name__ == "__main__":
    main()
