"""Reference outputs of PyPI ``betacal`` for tests/test_beta.py, and a fit timing.

Not part of calibd and not one of its dependencies. Run it in a scratch
virtualenv:

    python3 -m venv /tmp/ref-venv
    /tmp/ref-venv/bin/pip install betacal scikit-learn
    /tmp/ref-venv/bin/python benchmarks/reference/betacal_reference.py          # fixtures
    /tmp/ref-venv/bin/python benchmarks/reference/betacal_reference.py --time   # + timing at n = 1e6

It prints a Python literal; tests/test_beta.py holds a copy as BETACAL_REFERENCE
(produced with betacal 1.1.0, scikit-learn 1.9.1, numpy 2.4.6). The data are
made without a random generator (two Weyl sequences), so the test rebuilds
them bit for bit with ``reference_data`` (the same function is in the test).
"""

from __future__ import annotations

import sys
import time
from pprint import pformat

import numpy as np

PHI = (1.0 + 5.0**0.5) / 2.0
GRID = [0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999]

# name: (variant, n, true a, true b, true c) of the label model
# P(y = 1 | p) = sigmoid(a ln p - b ln(1 - p) + c).
CASES = {
    "abm": ("abm", 400, 1.6, 0.7, 0.4),
    "ab": ("ab", 400, 1.6, 0.7, 0.4),
    "am": ("am", 400, 1.6, 0.7, 0.4),
    # a < 0 in the label model: the unconstrained fit has a < 0 and betacal
    # drops ln p, refitting on -ln(1 - p) alone.
    "abm_drop_a": ("abm", 400, -0.6, 1.5, -0.5),
    # b < 0: betacal drops -ln(1 - p) and refits on ln p.
    "abm_drop_b": ("abm", 400, 1.5, -0.6, 0.5),
}


def reference_data(n: int, a: float, b: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores in (0.0005, 0.9995) and 0/1 labels drawn from the beta map, deterministically."""
    i = np.arange(1, n + 1, dtype=np.float64)
    p = 0.0005 + 0.999 * np.mod(i * 2.0**0.5, 1.0)
    truth = 1.0 / (1.0 + np.exp(-(a * np.log(p) - b * np.log1p(-p) + c)))
    labels = (np.mod(i * PHI, 1.0) < truth).astype(np.int64)
    return p, labels


def main() -> None:
    import betacal
    import sklearn
    from betacal import BetaCalibration

    out = {"versions": {"betacal": betacal.__version__, "scikit-learn": sklearn.__version__, "numpy": np.__version__}}
    for name, (variant, n, a, b, c) in CASES.items():
        scores, labels = reference_data(n, a, b, c)
        model = BetaCalibration(parameters=variant).fit(scores, labels)
        fitted_a, fitted_b, m = (float(v) for v in model.calibrator_.map_)
        out[name] = {
            "variant": variant,
            "data": [n, a, b, c],
            "a": fitted_a,
            "b": fitted_b,
            "m": m,
            "grid": GRID,
            "predictions": [float(v) for v in model.predict(np.asarray(GRID))],
        }
    print(pformat(out, width=110, sort_dicts=False))

    if "--time" in sys.argv:
        rng = np.random.default_rng(0)
        n = 1_000_000
        p = rng.beta(2.0, 5.0, n)
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(1.6 * np.log(p) - 0.7 * np.log1p(-p) + 0.4)))).astype(int)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            BetaCalibration(parameters="abm").fit(p, y)
            times.append(time.perf_counter() - start)
        print(f"betacal abm fit, n = {n}: best {min(times):.3f} s, all {', '.join(f'{t:.3f}' for t in times)}")


if __name__ == "__main__":
    main()
