"""Agreement with the reference implementations, to 1e-9, on identical arrays under the same convention.

The reference values were computed by benchmarks/reference/metrics_reference.py
in a scratch environment with scikit-learn, netcal, relplot and
uncertainty-calibration (versions in the fixture) and stored in
tests/fixtures/metrics_reference.json, so this suite needs none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibd.metrics import debiased_l2_ce, ece, reliability_diagram, smooth_ece

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "metrics_reference.json").read_text())
TOLERANCE = 1e-9


def weyl_case(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact-arithmetic recipe of the script: p_i = frac(i golden), y_i = 1[frac(i plastic) < p_i]."""
    i = np.arange(n, dtype=np.float64)
    p = np.modf(i * 0.6180339887498949)[0]
    u = np.modf(i * 0.7548776662466927)[0]
    return p, (u < p).astype(np.int64)


def load(name: str):
    case = FIXTURE["cases"][name]
    if "recipe" in case:
        p, y = weyl_case(case["recipe"]["n"])
        assert float(np.sum(p)) == case["checksum"]["sum_p"] and int(np.sum(y)) == case["checksum"]["sum_y"]
        return p, y, case["references"]
    return np.array(case["probabilities"]), np.array(case["labels"]), case["references"]


CASES = list(FIXTURE["cases"])


def target_of(p: np.ndarray) -> str:
    return "binary" if p.ndim == 1 else "top_label"


@pytest.mark.parametrize("name", CASES)
def test_netcal_ece_and_mce(name):
    p, y, refs = load(name)
    target = target_of(p)
    assert ece(p, y, n_bins=15, binning="uniform", target=target) == pytest.approx(refs["netcal_ece_uniform_15"], abs=TOLERANCE)
    assert ece(p, y, n_bins=15, norm="max", target=target) == pytest.approx(refs["netcal_mce_uniform_15"], abs=TOLERANCE)
    if refs["netcal_ece_quantile_15"] is None:
        # netcal (through scipy's binned_statistic_dd) refuses repeated quantile edges of tied predictions
        assert "numerically 0" in refs["netcal_ece_quantile_15_error"]
    else:
        assert ece(p, y, n_bins=15, binning="quantile", target=target) == pytest.approx(
            refs["netcal_ece_quantile_15"], abs=TOLERANCE
        )


@pytest.mark.parametrize("name", CASES)
def test_relplot_smooth_ece(name):
    p, y, refs = load(name)
    value, sigma = smooth_ece(p, y, target=target_of(p), return_sigma=True)
    assert value == pytest.approx(refs["relplot_smece"], abs=TOLERANCE)
    assert sigma == refs["relplot_smece_sigma"]


@pytest.mark.parametrize("name", CASES)
def test_uncertainty_calibration_debiased_l2(name):
    p, y, refs = load(name)
    if p.ndim == 1:
        binning = "discrete" if refs["uc_is_discrete"] else "quantile"
        assert debiased_l2_ce(p, y, binning=binning) == pytest.approx(refs["uc_debiased_l2"], abs=TOLERANCE)
        return
    binning = "discrete" if refs["uc_is_discrete_top_label"] else "quantile"
    assert debiased_l2_ce(p, y, binning=binning, target="top_label") == pytest.approx(
        refs["uc_debiased_l2_top_label"], abs=TOLERANCE
    )
    binning = "discrete" if refs["uc_is_discrete_marginal"] else "quantile"
    assert debiased_l2_ce(p, y, binning=binning, target="classwise") == pytest.approx(
        refs["uc_debiased_l2_marginal"], abs=TOLERANCE
    )


# scikit-learn's bins are right-closed, calibd's left-closed (netcal's convention): with predictions
# exactly on an interior edge (the discrete case's levels 0.2, 0.4, ... on k/15, its tied quantile
# edges) the bins differ by convention, so those cases are not compared (the script says which).
CURVES = [
    (name, strategy, n_bins)
    for name in CASES
    for strategy, n_bins in (("uniform", 15), ("quantile", 10))
    if not FIXTURE["cases"][name]["references"][f"sklearn_calibration_curve_{strategy}_{n_bins}"]["on_interior_edge"]
]


@pytest.mark.parametrize(("name", "strategy", "n_bins"), CURVES)
def test_sklearn_calibration_curve_bins(name, strategy, n_bins):
    p, y, refs = load(name)
    ref = refs[f"sklearn_calibration_curve_{strategy}_{n_bins}"]
    bins = reliability_diagram(p, y, n_bins=n_bins, binning=strategy, target=target_of(p))["bins"]
    full = [b for b in bins if b["count"] > 0]
    np.testing.assert_allclose([b["observed_frequency"] for b in full], ref["prob_true"], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose([b["mean_prediction"] for b in full], ref["prob_pred"], rtol=0, atol=TOLERANCE)


def test_every_case_has_a_curve_compared():
    assert len(CURVES) >= 6


def test_the_conventions_differ_exactly_on_edges():
    # scikit-learn puts 0.5 in [0, 0.5]; calibd (and netcal) in [0.5, 1].
    diagram = reliability_diagram([0.5, 0.9], [1, 1], n_bins=2)
    assert [b["count"] for b in diagram["bins"]] == [0, 2]
