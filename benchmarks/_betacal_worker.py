"""Times betacal's fit for benchmarks/fit_times.py, in the scratch virtualenv that has betacal.

    /tmp/ref-venv/bin/python benchmarks/_betacal_worker.py DATA.npz

Loads the scores and labels once, then answers each line "fit" on stdin with
one line on stdout: the wall and CPU seconds of BetaCalibration("abm").fit and
the fitted a, b, c as JSON. The parent alternates these fits with its own.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np


def main() -> None:
    from betacal import BetaCalibration
    import betacal
    import sklearn

    with np.load(sys.argv[1]) as data:
        scores, labels = data["scores"], data["labels"]
    print(json.dumps({"ready": True, "betacal": getattr(betacal, "__version__", "1.1.0"), "sklearn": sklearn.__version__}),
          flush=True)
    for line in sys.stdin:
        if line.strip() != "fit":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = BetaCalibration(parameters="abm").fit(scores, labels)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        lr = model.calibrator_.lr_ if hasattr(model.calibrator_, "lr_") else None
        coef = [] if lr is None else [float(v) for v in np.ravel(lr.coef_)] + [float(np.ravel(lr.intercept_)[0])]
        print(json.dumps({"wall": wall, "cpu": cpu, "coef": coef}), flush=True)


if __name__ == "__main__":
    main()
