"""A calibrator as an Open Inference Protocol model: what the REST routes and gRPC share.

The model is the calibrator, its versions are the stored versions. Inputs: ``scores`` (FP32 or
FP64, [n] for binary calibrators, [n, K] for multiclass and multivariate ones), the method's
extra arrays by name (``features``), and optionally ``ids`` (BYTES [n]) for the prediction log.
Outputs: ``probabilities`` (FP64) and the method's extras: ``intervals`` (FP64 [n, 2]),
``accepted`` (BOOL [n]), and ``decisions`` (INT64, or BYTES for named classes) given costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from ... import __version__
from ...calibration.selective import SelectiveCalibrator
from ...calibration.venn_abers import VennAbersCalibrator
from ...storage import repository
from ...storage.cache import LoadedCalibrator
from ...storage.repository import NotFound
from ..calibrate.router import calibrate_batch
from ..problems import Problem
from ..state import Services
from ..validation import MAX_VERSION, check_ids
from .tensors import FLOATS, TensorError, as_tensor

SERVER_NAME = "calibd"
#: Protocol extensions served: the binary tensor data extension over REST.
EXTENSIONS = ["binary_tensor_data"]
PLATFORM = "calibd_calibrator"


@dataclass
class Input:
    name: str
    datatype: str
    shape: tuple[int, ...]
    #: A flat list of numbers, an array of ``shape``, or (BYTES) a list of str or bytes.
    value: Any


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}


def parse_version(version: str | None) -> int | None:
    """A version from the URL or request: its number; one that is not a number cannot exist (404)."""
    if version is None or version == "":
        return None
    if not version.isdigit() or not 1 <= int(version) <= MAX_VERSION:
        raise Problem(404, f"version {version!r} does not exist: versions are positive integers")
    return int(version)


def _extras(calibrator: Any) -> list[str]:
    chosen = getattr(calibrator, "calibrator_", calibrator)  # auto serves through the method it chose
    if isinstance(chosen, VennAbersCalibrator):
        return ["intervals"]
    if isinstance(chosen, SelectiveCalibrator):
        return ["accepted"]
    return []


async def model_metadata(services: Services, name: str, version: int | None) -> dict[str, Any]:
    """The model's versions, inputs and outputs (of the version named, else the current one)."""
    info = await run_in_threadpool(repository.get_calibrator, services.sessions, name)
    loaded = await services.calibrator(name, version)
    calibrator = loaded.calibrator
    binary = loaded.n_classes == 2 and "binary" in calibrator.tasks  # else rows: multiclass or multivariate
    columns = [-1] if binary else [-1, calibrator.n_columns_]
    probability_shape = [-1] if loaded.n_classes == 2 else [-1, loaded.n_classes]
    inputs = [{"name": "scores", "datatype": "FP64", "shape": columns}]
    for array, spec in calibrator.predict_arrays.items():
        inputs.append({"name": array, "datatype": "FP64", "shape": [-1] * spec.ndim})
    inputs.append({"name": "ids", "datatype": "BYTES", "shape": [-1]})
    outputs = [{"name": "probabilities", "datatype": "FP64", "shape": probability_shape}]
    for extra in _extras(calibrator):
        shape = [-1, 2] if extra == "intervals" else [-1]
        outputs.append({"name": extra, "datatype": "FP64" if extra == "intervals" else "BOOL", "shape": shape})
    outputs.append({"name": "decisions", "datatype": "INT64" if loaded.classes is None else "BYTES", "shape": [-1]})
    return {
        "name": name,
        "versions": [str(v.version) for v in info.versions],
        "platform": PLATFORM,
        "inputs": inputs,
        "outputs": outputs,
    }


async def model_ready(services: Services, name: str, version: int | None) -> bool:
    """Whether the version (else the current one) can be served; an unknown model raises NotFound."""
    try:
        await services.calibrator(name, version)
    except NotFound:
        raise
    except LookupError:  # no current version
        return False
    return True


def _text_ids(value: Any, where: str) -> list[str]:
    try:
        return [item.decode() if isinstance(item, bytes) else item for item in value]
    except UnicodeDecodeError:
        raise TensorError(where, "ids must be UTF-8") from None


async def infer(
    services: Services,
    name: str,
    version: int | None,
    inputs: list[Input],
    ids: list[str] | None = None,
    costs: Any = None,
) -> tuple[LoadedCalibrator, list[tuple[str, np.ndarray]]]:
    """Calibrate the inputs through /calibrate's own batch step; the outputs by name.

    ``ids`` come from the request's ``parameters`` (REST) or an ``ids`` input (either protocol).
    """
    by_name: dict[str, Input] = {}
    for tensor in inputs:
        if tensor.name in by_name:
            raise TensorError(f"/inputs/{tensor.name}", "is given twice")
        by_name[tensor.name] = tensor
    scores = by_name.pop("scores", None)
    if scores is None:
        raise Problem.invalid("/inputs", "the input 'scores' is required")
    if scores.datatype not in FLOATS:
        raise TensorError("/inputs/scores/datatype", f"must be FP32 or FP64, not {scores.datatype}")
    if len(scores.shape) > 2:
        raise TensorError("/inputs/scores/shape", "must be [n] or [n, K]")
    given_ids = by_name.pop("ids", None)
    if given_ids is not None:
        if given_ids.datatype != "BYTES" or len(given_ids.shape) != 1:
            raise TensorError("/inputs/ids", "ids are BYTES of shape [n]")
        if ids is not None:
            raise TensorError("/inputs/ids", "ids are given both as an input and in parameters")
        ids = _text_ids(given_ids.value, "/inputs/ids")
    arrays = {}
    for array in by_name.values():
        if array.datatype == "BYTES":
            raise TensorError(f"/inputs/{array.name}/datatype", "must be numeric")
        arrays[array.name] = array.value
    if ids is not None:
        check_ids(ids)
    loaded, probabilities, extras = await calibrate_batch(services, name, version, scores.value, ids, arrays, costs)
    outputs = [("probabilities", probabilities)]
    outputs += [(key, as_tensor(value)) for key, value in extras.items()]
    return loaded, outputs
