"""ECCE and the multicalibration error against mcgrad 0.1.5 (fixtures it produced), and their properties."""

import json
from pathlib import Path

import numpy as np
import pytest

from calibd.inputs import CalibrationInputError
from calibd.metrics import interval_calibration
from calibd.metrics.multicalibration import check_options, ecce_p_value, multicalibration_error

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "mcgrad_multicalibration.json").read_text())
OPTION_NAMES = {"max_values_per_segment_feature": "max_values", "max_depth": "max_depth",
                "min_samples_per_segment": "min_samples", "max_n_segments": "max_segments"}


def run(case):
    options = check_options({OPTION_NAMES[k]: v for k, v in case["options"].items()})
    w = None if case["sample_weight"] is None else np.array(case["sample_weight"])
    segments = {k: np.array(v, dtype=object) for k, v in case["segments"].items()}
    return multicalibration_error(np.array(case["probabilities"]), np.array(case["labels"]), w, segments, **options)


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=lambda c: f"seed{c['seed']}")
def test_equals_mcgrad(case):
    assert FIXTURES["mcgrad"] == "0.1.5" and FIXTURES["precision_dtype"] == "float64"
    got, expected = run(case), case["expected"]
    assert got["global"]["ecce"] == pytest.approx(expected["global_ecce"], abs=1e-9)
    assert got["global"]["sigma"] == pytest.approx(expected["global_ecce_sigma"], abs=1e-9)
    assert got["global"]["p_value"] == pytest.approx(expected["global_ecce_pvalue"], abs=1e-9)
    assert got["mce"] == pytest.approx(expected["mce"], abs=1e-9)
    assert got["mce_sigma"] == pytest.approx(expected["mce_sigma"], abs=1e-9)
    assert got["mce_p_value"] == pytest.approx(expected["mce_pvalue"], abs=1e-9)
    # the same segments, in the same order, with the same numbers
    assert [s["values"] for s in got["segments"]] == [s["values"] for s in expected["segments"]]
    for mine, theirs in zip(got["segments"], expected["segments"]):
        assert mine["ecce"] == pytest.approx(theirs["ecce"], abs=1e-9)
        assert mine["sigma"] == pytest.approx(theirs["sigma"], abs=1e-9)
        assert mine["p_value"] == pytest.approx(theirs["p_value"], abs=1e-9)


def test_fixtures_cover_pooling_truncation_and_both_p_value_branches():
    by_seed = {c["seed"]: c["expected"] for c in FIXTURES["cases"]}
    assert any("__OTHER" in s["values"].values() for s in by_seed[1]["segments"])
    assert len(by_seed[3]["segments"]) == 150  # 120 rounded up to MCGrad's chunks of 50
    p_values = [s["p_value"] for c in by_seed.values() for s in c["segments"]]
    assert min(p_values) < 1e-15 and max(p_values) > 0.3


def test_global_ecce_is_interval_calibration_and_order_free():
    rng = np.random.default_rng(5)
    p = np.round(rng.uniform(0.05, 0.95, 3000), 2)  # many ties
    y = (rng.random(3000) < p).astype(int)
    seg = {"g": np.array(rng.choice(["a", "b"], 3000), dtype=object)}
    first = multicalibration_error(p, y, None, seg)
    assert first["global"]["ecce"] == pytest.approx(interval_calibration(p, y), abs=1e-12)
    shuffle = rng.permutation(3000)
    second = multicalibration_error(p[shuffle], y[shuffle], None, {"g": seg["g"][shuffle]})
    # (the order of segments follows first appearance, which ties may change; their numbers may not)
    shuffled = {tuple(s["values"].items()): s["ecce"] for s in second["segments"]}
    assert len(shuffled) == len(first["segments"])
    for segment in first["segments"]:
        assert shuffled[tuple(segment["values"].items())] == pytest.approx(segment["ecce"], abs=1e-12)


def test_segment_ecce_is_the_subset_ecce():
    rng = np.random.default_rng(6)
    p = rng.uniform(0.01, 0.99, 4000)
    y = (rng.random(4000) < p).astype(int)
    w = rng.uniform(0.5, 2.0, 4000)
    g = np.array(rng.choice(["a", "b", "c"], 4000), dtype=object)
    out = multicalibration_error(p, y, w, {"g": g})
    for segment in out["segments"][1:]:
        rows = g == segment["values"]["g"]
        assert segment["count"] == rows.sum()
        assert segment["ecce"] == pytest.approx(interval_calibration(p[rows], y[rows], w[rows]), abs=1e-12)


def test_p_value_is_the_tail_of_the_brownian_range():
    # Under calibration ECCE / sd is the range (max - min) of a standard Brownian motion on [0, 1].
    # Simulated: Gaussian walks of 4000 steps, the max and min shifted out by 0.5826 sqrt(dt) each
    # (Broadie, Glasserman & Kou's continuity correction for a discretely watched extremum).
    rng = np.random.default_rng(7)
    steps, ranges = 4000, []
    for _ in range(10):
        walk = np.cumsum(rng.normal(0, 1 / np.sqrt(steps), (1000, steps)), axis=1)
        high = np.maximum(walk.max(axis=1), 0)
        low = np.minimum(walk.min(axis=1), 0)
        ranges.append(high - low + 2 * 0.5826 / np.sqrt(steps))
    ranges = np.concatenate(ranges)
    for x in (1.0, 1.5, 2.0, 2.5, 3.0):
        assert ecce_p_value(x)[0] == pytest.approx(np.mean(ranges > x), abs=0.015)
    assert ecce_p_value(0.0)[0] == 1.0 and ecce_p_value(9.0)[0] == np.finfo(float).eps


def test_bad_options_name_the_field():
    with pytest.raises(CalibrationInputError) as error:
        check_options({"max_depth": -1})
    assert error.value.field == "options.multicalibration.max_depth"
    with pytest.raises(CalibrationInputError) as error:
        check_options({"depth": 1})
    assert error.value.field == "options.multicalibration.depth"


def test_worst_ranks_by_sigma_and_mde_is_five_standard_deviations():
    """``worst`` orders segments by sigma (not ECCE); each segment's mde is 5 x its ECCE's sd under calibration."""
    rng = np.random.default_rng(3)
    n = 4000
    p = rng.uniform(0.05, 0.95, n)
    tiny = np.zeros(n, dtype=bool)
    tiny[:28] = True  # a 28-row value: a large ECCE on noise alone
    big = rng.random(n) < 0.5
    y = (rng.random(n) < np.where(big, np.clip(p + 0.05, 0, 1), p)).astype(float)
    column = np.where(tiny, "tiny", np.where(big, "big", "rest")).astype(object)
    result = multicalibration_error(p, y, None, {"c": column}, max_values=5)
    sigmas = [s["sigma"] for s in result["worst"]]
    assert sigmas == sorted(sigmas, reverse=True) and result["worst"][0]["sigma"] == result["mce_sigma"]
    by_value = {s["values"].get("c"): s for s in result["segments"]}
    rows = np.flatnonzero(tiny)
    assert by_value["tiny"]["mde"] == pytest.approx(5 * np.sqrt(np.sum(p[rows] * (1 - p[rows]))) / rows.shape[0])
    assert by_value["tiny"]["ecce"] > by_value["big"]["ecce"]  # raw ECCE would put the tiny value first
    assert [s["values"].get("c") for s in result["worst"]].index("big") < [s["values"].get("c") for s in result["worst"]].index("tiny")
