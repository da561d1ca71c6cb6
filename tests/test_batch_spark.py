"""Batch calibration in Spark (local[2]) and from Parquet gives /calibrate's answers, bit for bit.

Each registered method is fitted through the API, exported, and applied by ``calibd.batch`` to a
100,000-row table; the same rows go to ``POST /calibrate`` over HTTP, and every output column
must be equal exactly. Spark cuts the table into partitions and Arrow batches of 7,000 rows, so
the equality also shows that no row's answer depends on the rows batched with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest

from calibd.batch import calibrate_parquet, calibrate_spark
from calibd.calibration import METHODS
from calibd.config import Settings

from . import test_angular as angular_simulation
from .conftest import LiveServer, migrated_database

pd = pytest.importorskip("pandas")  # the test extra installs calibd[spark]: pyspark, pandas
pytest.importorskip("pyspark")

ROWS = 100_000
HOLDOUT = 2_000
K = 3
FEATURES = 3
# Options that keep the slower fits (cross-fitted five times over) to seconds.
# Methods whose features are named columns ({"x0": [...], "segment": [...]}), not rows.
NAMED_FEATURES = {"multicalibration"}
OPTIONS = {
    "selective": {"epochs": 5},
    "auto": {"candidates": ["platt", "beta"]},
    "multicalibration": {"max_rounds": 20},
    "angular": {"lambda": 0.5, "link": {"family": "logistic", "scale": 3.0, "offset": 1.0}},
}


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        pytest.skip("no Java: PySpark needs a JRE (.ci/run installs one)")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("calibd-batch-test")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "7000")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    with migrated_database("sqlite", tmp_path_factory.mktemp("batch")) as url:
        with LiveServer(Settings(database_url=url)) as live, httpx.Client(base_url=live.url, timeout=300) as client:
            yield client


def cases() -> list[tuple[str, str]]:
    """(method, kind of scores): every method, and temperature on multiclass rows too."""
    out = []
    for name, cls in sorted(METHODS.items()):
        kind = "multiclass" if cls.tasks == ("multiclass",) else "multivariate" if cls.tasks == ("multivariate",) else "binary"
        out.append((name, kind))
    out.append(("temperature", "multiclass"))
    return out


def _data(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logit scores, labels and a feature embedding whose first column shifts the truth."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, FEATURES))
    if kind == "multiclass":
        z = rng.normal(0.0, 2.0, (n, K))
        p = np.exp(0.7 * z)
        p /= p.sum(axis=1, keepdims=True)
        labels = (rng.uniform(size=(n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
        return z, labels, features
    z = rng.normal(0.0, 2.0, n if kind == "binary" else (n, 2))
    margin = 0.8 * (z if kind == "binary" else z.mean(axis=1)) - 0.3 + 0.5 * features[:, 0]
    labels = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-margin))).astype(int)
    return z, labels, features


def _fit(http: httpx.Client, method: str, kind: str) -> tuple[str, dict]:
    name = f"batch-{method}-{kind}"
    if method == "angular":
        sim = angular_simulation.simulate(21, n=80, d=60, n_holdout=120)
        holdout = {"scores": sim.u_holdout.tolist(), "labels": sim.y_holdout.tolist(), "X": sim.X.tolist(),
                   "y": sim.y.tolist(), "w_hat": sim.w_hat.tolist(), "Sigma": sim.Sigma.tolist()}
    else:
        z, labels, features = _data(kind, HOLDOUT, seed=1)
        holdout = {"scores": z.tolist(), "labels": labels.tolist()}
        if method in NAMED_FEATURES:
            holdout["features"] = _named(features)
        elif "features" in _declared(method, "fit_arrays"):
            holdout["features"] = features.tolist()
    body = {"name": name, "method": method, "input": "logit", "options": OPTIONS.get(method, {}), "holdout": holdout}
    response = http.post("/calibrators", json=body)
    assert response.status_code == 201, response.text
    exported = http.get(f"/calibrators/{name}/versions/1").json()
    return name, json.loads(json.dumps(exported))  # as it would arrive from a file


def _declared(method: str, kind: str) -> dict:
    """The arrays the method declares with the options used here (auto's depend on its candidates)."""
    return getattr(METHODS[method].from_options("logit", OPTIONS.get(method, {})), kind)


def _named(features: np.ndarray) -> dict[str, list]:
    """Named columns: a numeric one, and a categorical one cut from the next feature."""
    segment = np.where(features[:, 1] > 0.5, "high", np.where(features[:, 1] < -0.5, "low", "mid"))
    return {"x0": features[:, 0].tolist(), "segment": segment.tolist()}


def _table(method: str, kind: str) -> tuple[object, dict]:
    """The rows as a pandas table (id, score or score_0.., features) and as /calibrate's body."""
    z, _, features = _data(kind, ROWS, seed=2)
    if method == "angular":
        z = np.random.default_rng(3).normal(0.0, 1.5, ROWS)
    table = {"id": np.arange(ROWS)}
    if z.ndim == 1:
        table["score"] = z
    else:
        table |= {f"score_{j}": z[:, j] for j in range(z.shape[1])}
    body = {"scores": z.tolist()}
    if method in NAMED_FEATURES:
        table |= _named(features)
        body["features"] = _named(features)
    elif "features" in _declared(method, "predict_arrays"):
        table["features"] = list(features)
        body["features"] = features.tolist()
    return pd.DataFrame(table), body


@pytest.mark.parametrize("method,kind", cases(), ids=[f"{m}-{k}" for m, k in cases()])
def test_spark_gives_calibrate_bit_for_bit(spark, http, method, kind):
    name, exported = _fit(http, method, kind)
    table, body = _table(method, kind)
    served = http.post("/calibrate", json={"calibrator": name, **body})
    assert served.status_code == 200, served.text
    answer = served.json()

    frame = spark.createDataFrame(table).repartition(3)
    arrays = {"features": ["x0", "segment"]} if method in NAMED_FEATURES else None
    out = calibrate_spark(frame, exported, arrays=arrays).toPandas().sort_values("id").reset_index(drop=True)
    assert out.shape[0] == ROWS and list(out["id"]) == list(range(ROWS))
    probabilities = np.asarray(answer["probabilities"])
    if probabilities.ndim == 1:
        np.testing.assert_array_equal(out["probability"].to_numpy(), probabilities)
    else:
        np.testing.assert_array_equal(out[[f"p_{k}" for k in range(probabilities.shape[1])]].to_numpy(), probabilities)
    for key in set(answer) - {"calibrator", "version", "probabilities", "classes"}:
        extra = np.asarray(answer[key])
        columns = [key] if extra.ndim == 1 else [f"{key}_{j}" for j in range(extra.shape[1])]
        np.testing.assert_array_equal(out[columns].to_numpy().reshape(extra.shape), extra)
    # The input columns pass through unchanged.
    passed = [c for c in table.columns if c != "features"]
    np.testing.assert_array_equal(out[passed].to_numpy(), table[passed].to_numpy())


def test_calibrate_parquet_cli_gives_calibrate_bit_for_bit(http, tmp_path):
    """``calibd calibrate --input scores.parquet --output calibrated.parquet``, offline from an export file."""
    name, exported = _fit(http, "isotonic", "binary")
    table, body = _table("isotonic", "binary")
    served = np.asarray(http.post("/calibrate", json={"calibrator": name, **body}).json()["probabilities"])
    source, target, model = tmp_path / "scores.parquet", tmp_path / "calibrated.parquet", tmp_path / "model.json"
    table.to_parquet(source, row_group_size=30_000)
    model.write_text(json.dumps(exported))
    done = subprocess.run(
        [sys.executable, "-m", "calibd.cli", "calibrate", "--input", str(source), "--output", str(target), "--export", str(model)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = pd.read_parquet(target)
    np.testing.assert_array_equal(out["id"].to_numpy(), table["id"].to_numpy())
    np.testing.assert_array_equal(out["probability"].to_numpy(), served)
    assert f"calibrated {ROWS} rows" in done.stderr
    # The same from the running service's current version, by name.
    again = subprocess.run(
        [sys.executable, "-m", "calibd.cli", "calibrate", name, "--input", str(source), "--output", str(target),
         "--url", str(http.base_url)],
        capture_output=True, text=True, timeout=120,
    )
    assert again.returncode == 0, again.stderr
    np.testing.assert_array_equal(pd.read_parquet(target)["probability"].to_numpy(), served)
    # In-process, too: the function behind the command.
    assert calibrate_parquet(str(source), str(target), exported) == ROWS
