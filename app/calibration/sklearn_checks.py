"""scikit-learn estimator checks that do not apply to calibd's calibrators, each with its reason.

``Calibrator.expected_failed_checks`` picks from these lists by the method's tasks and
minimum holdout; tests/test_sklearn_checks.py runs every other check and shows that each
listed one does fail.
"""

from __future__ import annotations

ONE_D_INDEXING = (
    "the check makes X 1-D for a one_d_array estimator, then indexes it as 2-D (X[:, 0] or X.shape[1]); "
    "tests/test_sklearn_checks.py checks the same property on 1-D scores"
)
ONE_D_INDEXING_CHECKS = (
    "check_dont_overwrite_parameters", "check_dtype_object", "check_estimator_sparse_array",
    "check_f_contiguous_array_estimator", "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_fit2d_1sample", "check_fit2d_1feature", "check_dict_unchanged", "check_fit2d_predict1d",
    "check_n_features_in", "check_n_features_in_after_fitting",
)
SEVERAL_COLUMNS = (
    "the check fits X of several columns; a binary calibrator takes one score per row "
    "(tests/test_sklearn_checks.py checks sample weights on 1-D scores)"
)
SEVERAL_COLUMN_CHECKS = (
    "check_sample_weights_shape", "check_sample_weights_not_overwritten", "check_sample_weight_equivalence_on_dense_data",
)
BLOBS = "the check's labels 0, 1, 2 name three classes but X has two score columns (one per class)"
BLOBS_CHECKS = ("check_estimators_overwrite_params", "check_estimators_fit_returns_self", "check_readonly_memmap_input")
FEW_ROWS_CHECKS = (
    "check_n_features_in_after_fitting", "check_estimators_nan_inf", "check_fit2d_1feature",
    "check_sample_weights_not_an_array", "check_sample_weights_shape", "check_sample_weights_not_overwritten",
    "check_sample_weights_pandas_series",
)
ONE_ROW_CLASS = (
    "integer weights on 15 rows leave a class on one row of positive weight; calibd needs two rows "
    "of each class present, so that cross-fitting's folds all see it"
)


def expected_failed_checks(method: str, tasks: tuple[str, ...], min_samples: int) -> dict[str, str]:
    """The checks that do not apply to a method with these ``tasks`` and ``min_samples``, with reasons."""
    expected: dict[str, str] = {}
    if tasks == ("binary",):
        expected |= dict.fromkeys(ONE_D_INDEXING_CHECKS, ONE_D_INDEXING)
        expected["check_fit1d"] = "1-D scores are a binary calibrator's own input; the check expects them refused"
        expected |= dict.fromkeys(SEVERAL_COLUMN_CHECKS, SEVERAL_COLUMNS)
    if "multiclass" in tasks:
        expected |= dict.fromkeys(BLOBS_CHECKS, BLOBS)
        expected["check_sample_weight_equivalence_on_dense_data"] = ONE_ROW_CLASS
    if min_samples > 16:
        few = f"{method} needs at least {min_samples} rows; the check fits 10 to 16"
        for check in FEW_ROWS_CHECKS:
            expected.setdefault(check, few)
    return expected
