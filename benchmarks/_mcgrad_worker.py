"""MCGrad 0.1.5 on one benchmark case, in its own virtualenv (benchmarks/segments.py starts it).

    PYTHON benchmarks/_mcgrad_worker.py fit CASE.npz OUT.npz [THREADS]  # fit and predict MCGrad, timed
    PYTHON benchmarks/_mcgrad_worker.py mce CASE.npz PRED.npz OUT.json  # mcgrad's MCE of each prediction set
    PYTHON benchmarks/_mcgrad_worker.py dataset NAME OUT.npz            # a table shipped inside statsmodels

CASE.npz holds train_p, train_y, test_p, test_y and, per column c, train_c /
test_c (strings for the names in ``categorical``, floats for those in ``numeric``).
"""

import json
import sys
import time

import numpy as np


def columns_of(case):
    return [str(c) for c in case["categorical"]], [str(c) for c in case["numeric"]]


def frames(case):
    import pandas as pd

    categorical, numeric = columns_of(case)
    out = []
    for part in ("train", "test"):
        frame = pd.DataFrame({"p": case[f"{part}_p"], "y": case[f"{part}_y"],
                              **{c: case[f"{part}_{c}"].astype(str) for c in categorical},
                              **{c: case[f"{part}_{c}"].astype(np.float64) for c in numeric}})
        out.append(frame)
    return out[0], out[1], categorical, numeric


def fit(case_path, out_path, threads):
    from mcgrad.methods import MCGrad

    case = np.load(case_path, allow_pickle=False)
    train, test, categorical, numeric = frames(case)
    params = None if threads is None else {**MCGrad.DEFAULT_HYPERPARAMS["lightgbm_params"], "num_threads": threads}
    model = MCGrad(lightgbm_params=params)
    started = time.perf_counter()
    model.fit(train, prediction_column_name="p", label_column_name="y", categorical_feature_column_names=categorical or None,
              numerical_feature_column_names=numeric or None)
    fit_seconds = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict(test, prediction_column_name="p", categorical_feature_column_names=categorical or None,
                              numerical_feature_column_names=numeric or None)
    predict_seconds = time.perf_counter() - started
    np.savez(out_path, predicted=np.asarray(predicted, dtype=np.float64), fit_seconds=fit_seconds, predict_seconds=predict_seconds,
             rounds=len(model.mr))


def mce(case_path, predictions_path, out_path):
    import pandas as pd
    from mcgrad.metrics import MulticalibrationError

    case = np.load(case_path, allow_pickle=False)
    predictions = np.load(predictions_path, allow_pickle=False)
    categorical, numeric = columns_of(case)
    out = {}
    for name in predictions.files:
        frame = pd.DataFrame({"p": predictions[name], "y": case["test_y"],
                              **{c: case[f"test_{c}"].astype(str) for c in categorical},
                              **{c: case[f"test_{c}"].astype(np.float64) for c in numeric}})
        metric = MulticalibrationError(frame, label_column="y", score_column="p", categorical_segment_columns=categorical or None,
                                       numerical_segment_columns=numeric or None, precision_dtype="float64")
        out[name] = {"mce": float(metric.mce), "mce_sigma": float(metric.mce_sigma)}
    with open(out_path, "w") as handle:
        json.dump(out, handle)


def dataset(name, out_path):
    import statsmodels.datasets as datasets

    data = getattr(datasets, name).load_pandas().data
    np.savez(out_path, **{c: data[c].to_numpy(dtype=np.float64) for c in data.columns})


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "fit":
        fit(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif command == "mce":
        mce(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "dataset":
        dataset(sys.argv[2], sys.argv[3])
