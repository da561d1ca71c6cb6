"""An import is held to the checks every fit's output passes, and a 422 names the field.

``Calibrator.check_state`` is the one place: fits run it on what they learned,
imports on what they are sent. Each case takes a real export and breaks one
thing in its parameters.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from calibd.calibration import from_dict
from calibd.calibration.registry import METHODS

RNG = np.random.default_rng(3)
BINARY = RNG.uniform(0.02, 0.98, 400).round(4)
BINARY_LABELS = (RNG.uniform(size=400) < BINARY).astype(int)
ROWS = RNG.dirichlet([2.0, 2.0, 2.0], 400).round(4)
ROWS = (ROWS / ROWS.sum(axis=1, keepdims=True)).tolist()
ROW_LABELS = RNG.integers(0, 3, 400).tolist()


def export_of(client, name: str, method: str) -> dict:
    multiclass = "multiclass" in METHODS[method].tasks and "binary" not in METHODS[method].tasks
    holdout = {"scores": ROWS, "labels": ROW_LABELS} if multiclass else {"scores": BINARY.tolist(), "labels": BINARY_LABELS.tolist()}
    response = client.post("/calibrators", json={"name": name, "method": method, "holdout": holdout})
    assert response.status_code == 201, response.text
    stored = client.get(f"/calibrators/{name}/versions/1").json()
    keys = ("method", "input", "n_classes", "classes", "n_samples", "holdout_sha256", "fit_seconds", "summary", "parameters")
    return {"format": "calibd-calibrator", "format_version": 1, "name": name, "version": 1} | {key: stored[key] for key in keys}


def first_fall(values) -> int:
    return next(i for i in range(1, len(values)) if values[i] < values[i - 1])


def reversed_y(state):
    state["y_thresholds_"] = state["y_thresholds_"][::-1]
    return f"/parameters/state/y_thresholds_/{first_fall(state['y_thresholds_'])}", "non-decreasing"


def y_above_one(state):
    state["y_thresholds_"][-1] = 1.5
    return f"/parameters/state/y_thresholds_/{len(state['y_thresholds_']) - 1}", "within [0, 1]"


def x_outside(state):
    state["x_thresholds_"][0] = -0.5
    return "/parameters/state/x_thresholds_/0", "within [0, 1]"


def shorter_y(state):
    state["y_thresholds_"] = state["y_thresholds_"][:-1]
    return "/parameters/state/y_thresholds_", "shape"


def infinite_a(state):
    state["a_"] = float("inf")
    return "/parameters/state/a_", "finite"


def text_b(state):
    state["b_"] = "0.5"
    return "/parameters/state/b_", "finite number"


def histogram_values(state):
    state["values_"] = state["values_"][:-2]
    return "/parameters/state/values_", "shape"


def histogram_edges(state):
    state["edges_"][1], state["edges_"][2] = state["edges_"][2], state["edges_"][1]
    return "/parameters/state/edges_/2", "non-decreasing"


def venn_abers_p1(state):
    state["p1_"][3] = -0.25
    return "/parameters/state/p1_/3", "within [0, 1]"


def matrix_weights(state):
    state["weights_"] = [row[:2] for row in state["weights_"]]
    return "/parameters/state/weights_", "shape"


def temperature_zero(state):
    state["temperature_"] = 0.0
    return "/parameters/state/temperature_", "positive"


def ovr_component(state):
    # The second class's isotonic part, reversed: the pointer lands in the packed array.
    start, end = state["offsets_"][1][1], state["offsets_"][2][1]
    state["y_thresholds_"][start:end] = state["y_thresholds_"][start:end][::-1]
    return f"/parameters/state/y_thresholds_/{start + first_fall(state['y_thresholds_'][start:end])}", "component 1"


def auto_inner(state):
    inner = state["calibrator_"]["state"]
    key = next(iter(inner))
    inner[key] = [float("nan")] if isinstance(inner[key], list) else float("nan")
    return f"/parameters/state/calibrator_/state/{key}", "finite"


CASES = [
    ("isotonic", reversed_y), ("isotonic", y_above_one), ("isotonic", x_outside), ("isotonic", shorter_y),
    ("platt", infinite_a), ("platt", text_b), ("histogram", histogram_values), ("histogram", histogram_edges),
    ("venn_abers", venn_abers_p1), ("matrix", matrix_weights), ("temperature", temperature_zero),
    ("ovr_isotonic", ovr_component), ("auto", auto_inner),
]


@pytest.mark.parametrize("method,breaking", CASES, ids=[f"{m}-{b.__name__}" for m, b in CASES])
def test_an_import_whose_state_fails_a_check_gets_422_naming_the_field(client, row_counts, name, method, breaking):
    export = export_of(client, name, method)
    # The export as it is imports, and the state passes the same checks offline.
    from_dict(export["parameters"]).check_state()
    broken = copy.deepcopy(export)
    at, words = breaking(broken["parameters"]["state"])
    before = row_counts()
    # json.dumps writes NaN and Infinity literals, which calibd reads so that it can point at them.
    response = client.post(f"/calibrators/{name}-copy/import", content=json.dumps(broken), headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["errors"][0]["pointer"] == at, problem
    assert words in problem["detail"], problem
    assert row_counts() == before
    assert client.post(f"/calibrators/{name}-copy/import", json=export).status_code == 201


def test_a_binary_method_claiming_three_classes_is_refused(client, row_counts, name):
    export = export_of(client, name, "isotonic")
    export["n_classes"] = export["parameters"]["n_classes"] = 3
    before = row_counts()
    response = client.post(f"/calibrators/{name}-copy/import", json=export)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["pointer"] == "/parameters/n_classes", response.text
    assert row_counts() == before


@pytest.mark.parametrize("method", sorted(m for m, cls in METHODS.items() if "binary" in cls.tasks and not any(s.required for s in cls.fit_arrays.values())))
def test_every_fit_output_passes_the_state_checks(method):
    calibrator = METHODS[method]().fit(BINARY, BINARY_LABELS)
    from_dict(json.loads(json.dumps(calibrator.to_dict()))).check_state()
