"""Batch calibration: a stored calibrator applied to a whole table, in Spark or on one machine.

Given a calibrator's export (``calibd export NAME -o model.json``, ``client.export(name)`` or
``GET /calibrators/{name}/versions/{v}``; plain JSON parameters only), every row gets the
probabilities ``POST /calibrate`` would answer for it, bit for bit: the calibrator is rebuilt
as the service rebuilds it (``from_dict``, then ``prepare``) and called the same way
(``predict_details`` on float64 arrays). Spark runs it per partition with ``mapInPandas``::

    import json
    from calibd.batch import calibrate_spark

    exported = json.load(open("model.json"))
    calibrated = calibrate_spark(spark.table("scores"), exported)   # adds "probability"

Columns in: ``score`` (binary), ``score_0..score_{K-1}`` or one array column (rows of K), and
the method's extra arrays (``features``: an array column, or ``features_0..``; named columns,
as ``multicalibration`` takes, by ``arrays={"features": ["country", "age"]}``). Columns out,
added after the input's: ``probability`` (binary) or ``p_0..p_{K-1}``, then the method's
per-row extras (``venn_abers``'s interval as ``intervals_0``, ``intervals_1``; ``selective``'s
``accepted``), named as ``calibd calibrate`` names its CSV columns.

PySpark is an optional extra (``pip install 'calibd[spark]'``) and is imported only by
``calibrate_spark``; ``calibrate_parquet`` needs pandas and pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .calibration import Calibrator, from_dict


def load_calibrator(exported: Mapping[str, Any]) -> Calibrator:
    """The calibrator of an export (or a version's JSON, or bare ``to_dict`` parameters), as
    the service's cache loads it."""
    parameters = exported.get("parameters", exported)
    calibrator = from_dict(parameters)
    calibrator.prepare()
    return calibrator


def output_columns(probabilities: np.ndarray, extras: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The output columns of calibrated rows: ``probability`` (or ``p_0..p_{K-1}``), then each
    per-row extra (a 2-D one as ``name_0``, ``name_1``, ...)."""
    columns: dict[str, np.ndarray] = {}
    if probabilities.ndim == 1:
        columns["probability"] = probabilities
    else:
        columns |= {f"p_{k}": probabilities[:, k] for k in range(probabilities.shape[1])}
    for key, value in extras.items():
        value = np.asarray(value)
        if value.ndim == 1 and value.shape[0] == probabilities.shape[0]:
            columns[key] = value
        elif value.ndim == 2 and value.shape[0] == probabilities.shape[0]:
            columns |= {f"{key}_{j}": value[:, j] for j in range(value.shape[1])}
    return columns


def input_columns(
    names: Sequence[str], calibrator: Calibrator, scores: str | Sequence[str] | None = None,
    arrays: Mapping[str, str | Sequence[str]] | None = None,
) -> tuple[str | list[str], dict[str, str | list[str]]]:
    """Which columns hold the scores and each extra array: as given, else ``score`` or
    ``score_0..``, and for each array the method takes, a column of its name or ``name_0..``."""
    if scores is None:
        scores = "score" if "score" in names else indexed_columns(names, "score")
        if not scores:
            raise ValueError(f"no 'score' column, nor score_0, score_1, ... (columns: {', '.join(names)})")
    chosen = dict(arrays or {})
    for name in calibrator.predict_arrays:
        if name not in chosen:
            found = name if name in names else indexed_columns(names, name)
            if found:
                chosen[name] = found
    return (scores if isinstance(scores, str) else list(scores)), {k: v if isinstance(v, str) else list(v) for k, v in chosen.items()}


def calibrate_pandas(frame: Any, calibrator: Calibrator, scores: str | list[str], arrays: Mapping[str, str | list[str]]) -> Any:
    """``frame`` (a pandas DataFrame) with the calibrated columns added (last; an input column
    of the same name is replaced)."""
    columns = _calibrated_columns(frame, calibrator, scores, arrays)
    return frame.drop(columns=[name for name in columns if name in frame.columns]).assign(**columns)


def _calibrated_columns(
    frame: Any, calibrator: Calibrator, scores: str | list[str], arrays: Mapping[str, str | list[str]]
) -> dict[str, np.ndarray]:
    values = _matrix(frame, scores)
    extra = {
        # Named columns (multicalibration's features) go as /calibrate gets them: lists by name.
        name: {c: frame[c].tolist() for c in columns} if calibrator.predict_arrays[name].columns else _matrix(frame, columns)
        for name, columns in arrays.items()
    }
    probabilities, extras = calibrator.predict_details(values, **extra)
    return output_columns(probabilities, extras)


def calibrate_spark(
    frame: Any, exported: Mapping[str, Any], scores: str | Sequence[str] | None = None,
    arrays: Mapping[str, str | Sequence[str]] | None = None,
) -> Any:
    """A Spark DataFrame with the calibrated columns added, computed per partition (mapInPandas).

    The output schema is the input's plus the new columns, whose types come from calibrating
    the first row on the driver.
    """
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StructField, StructType

    calibrator = load_calibrator(exported)
    score_columns, array_columns = input_columns(frame.columns, calibrator, scores, arrays)
    first = frame.limit(1).toPandas()
    if first.empty:
        raise ValueError("the DataFrame has no rows to calibrate")
    added = _calibrated_columns(first, calibrator, score_columns, array_columns)
    spark_type = {"f": DoubleType(), "b": BooleanType(), "i": LongType(), "u": LongType()}
    schema = StructType(
        [field for field in frame.schema.fields if field.name not in added]
        + [StructField(name, spark_type[values.dtype.kind], False) for name, values in added.items()]
    )
    parameters = dict(exported.get("parameters", exported))

    def calibrate_batches(batches: Iterator[Any]) -> Iterator[Any]:
        # Executors get the export's plain JSON and rebuild the calibrator once per partition.
        local = load_calibrator(parameters)
        for batch in batches:
            if len(batch):
                yield calibrate_pandas(batch, local, score_columns, array_columns)

    return frame.mapInPandas(calibrate_batches, schema)


def calibrate_parquet(
    source: str, target: str, exported: Mapping[str, Any], scores: str | Sequence[str] | None = None,
    arrays: Mapping[str, str | Sequence[str]] | None = None,
) -> int:
    """Calibrate a Parquet file into another, on one machine (``calibd calibrate --input``);
    the same per-batch code as ``calibrate_spark``. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    calibrator = load_calibrator(exported)
    reader = pq.ParquetFile(source)
    score_columns, array_columns = input_columns(reader.schema_arrow.names, calibrator, scores, arrays)
    rows = 0
    writer = None
    try:
        for batch in reader.iter_batches(batch_size=1 << 20):
            table = pa.Table.from_pandas(
                calibrate_pandas(batch.to_pandas(), calibrator, score_columns, array_columns), preserve_index=False
            )
            if writer is None:
                writer = pq.ParquetWriter(target, table.schema)
            writer.write_table(table)
            rows += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise ValueError(f"{source}: no rows to calibrate")
    return rows


def indexed_columns(names: Sequence[str], prefix: str) -> list[str]:
    """``prefix_0, prefix_1, ...`` as far as they run unbroken (the columns of one array)."""
    found = []
    while f"{prefix}_{len(found)}" in names:
        found.append(f"{prefix}_{len(found)}")
    return found


def _matrix(frame: Any, columns: str | list[str]) -> np.ndarray:
    """A column as float64 (n,), an array column as rows (n, K), several columns as (n, K)."""
    if isinstance(columns, list):
        return np.column_stack([frame[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in columns])
    column = frame[columns]
    if column.dtype == object:  # an array column: one sequence per row
        return np.asarray(np.stack(column.to_numpy()), dtype=np.float64)
    return column.to_numpy(dtype=np.float64, na_value=np.nan)
