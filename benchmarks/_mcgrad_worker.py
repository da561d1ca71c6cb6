"""MCGrad 0.1.5 on one benchmark case, in its own virtualenv (benchmarks/segments.py starts it).

    PYTHON benchmarks/_mcgrad_worker.py fit CASE.npz OUT.npz        # fit and predict MCGrad, timed
    PYTHON benchmarks/_mcgrad_worker.py mce CASE.npz PRED.npz OUT.json  # mcgrad's MCE of each prediction set
    PYTHON benchmarks/_mcgrad_worker.py fair OUT.npz                # statsmodels' "fair" table, on disk

CASE.npz holds train_p, train_y, test_p, test_y and, per categorical column c,
train_c / test_c (strings); ``columns`` lists them.
"""

import json
import sys
import time

import numpy as np


def frames(case):
    import pandas as pd

    columns = [str(c) for c in case["columns"]]
    train = pd.DataFrame({"p": case["train_p"], "y": case["train_y"], **{c: case[f"train_{c}"] for c in columns}})
    test = pd.DataFrame({"p": case["test_p"], "y": case["test_y"], **{c: case[f"test_{c}"] for c in columns}})
    for c in columns:
        train[c] = train[c].astype(str)
        test[c] = test[c].astype(str)
    return train, test, columns


def fit(case_path, out_path, threads):
    from mcgrad.methods import MCGrad

    case = np.load(case_path, allow_pickle=False)
    train, test, columns = frames(case)
    params = None if threads is None else {**MCGrad.DEFAULT_HYPERPARAMS["lightgbm_params"], "num_threads": threads}
    model = MCGrad(lightgbm_params=params)
    started = time.perf_counter()
    model.fit(train, prediction_column_name="p", label_column_name="y", categorical_feature_column_names=columns)
    fit_seconds = time.perf_counter() - started
    started = time.perf_counter()
    predicted = model.predict(test, prediction_column_name="p", categorical_feature_column_names=columns)
    predict_seconds = time.perf_counter() - started
    np.savez(out_path, predicted=np.asarray(predicted, dtype=np.float64), fit_seconds=fit_seconds, predict_seconds=predict_seconds)


def mce(case_path, predictions_path, out_path):
    import pandas as pd
    from mcgrad.metrics import MulticalibrationError

    case = np.load(case_path, allow_pickle=False)
    predictions = np.load(predictions_path, allow_pickle=False)
    columns = [str(c) for c in case["columns"]]
    out = {}
    for name in predictions.files:
        frame = pd.DataFrame({"p": predictions[name], "y": case["test_y"], **{c: case[f"test_{c}"].astype(str) for c in columns}})
        metric = MulticalibrationError(frame, label_column="y", score_column="p", categorical_segment_columns=columns,
                                       precision_dtype="float64")
        out[name] = {"mce": float(metric.mce), "mce_sigma": float(metric.mce_sigma)}
    with open(out_path, "w") as handle:
        json.dump(out, handle)


def fair(out_path):
    from statsmodels.datasets import fair as dataset

    data = dataset.load_pandas().data
    np.savez(out_path, **{c: data[c].to_numpy(dtype=np.float64) for c in data.columns})


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "fit":
        fit(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif command == "mce":
        mce(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "fair":
        fair(sys.argv[2])
