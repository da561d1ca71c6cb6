"""Angular calibration of a linear classifier trained in high dimensions.

Li & Sur, "Optimal and provable calibration in high-dimensional binary classification: angular
calibration and Platt scaling" (papers/000). For x ~ N(0, Sigma) and P(y = 1 | x) = F(a w*'x + b),
a ridge-regularised logistic regression's weights w_hat, and u = w_hat'x, the calibrated
probability is exactly (eq. 3)

    f(u) = E_Z[ F(a (cos(theta) u / ||w_hat||_Sigma + sin(theta) Z) + b) ],  Z ~ N(0, 1),

by Gauss-Hermite quadrature (or the trapezoid rule for a steep link; closed form for probit),
where theta, the angle between w* and w_hat in the Sigma geometry, is estimated from the
training data (Bellec's estimator, eqs. 11-13; the sign from the holdout). Inputs (``fit_arrays``):
X, y, w_hat, and Sigma or X_unlabeled. Options: see ``AngularCalibrator``. The derivation, the
correction to the printed gamma, and the sensitivity to w_hat's stationarity: docs/methods/angular.md.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from numbers import Integral, Real
from typing import Any

import numpy as np
from scipy.linalg import LinAlgError, cholesky, solve_triangular
from scipy.special import ndtr

from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import sigmoid
from .validation import ArraySpec

DEFAULT_MAX_DIMENSION = 5000
#: The largest ``max_dimension`` an option may set.
MAX_DIMENSION_CEILING = 20000
DEFAULT_QUADRATURE_NODES = 40
LINK_FAMILIES = ("logistic", "probit")
LOSSES = ("logistic",)
SIGN_ESTIMATORS = ("paper", "centered")
#: Gauss-Hermite with n nodes is used while GH_NODES_PER_SPREAD_SQUARED * spread^2 <= n;
#: beyond, the trapezoid rule with step TRAPEZOID_STEP / spread (both about 1e-6 accurate).
GH_NODES_PER_SPREAD_SQUARED = 4.84
TRAPEZOID_STEP = 1.3
#: Sigma must be symmetric to this relative tolerance.
SYMMETRY_TOLERANCE = 1e-8


# -- the angle estimator ------------------------------------------------------


def corrected_gamma(trace_xhxd: float, trace_d_minus_dxhxd: float, n: int) -> float:
    """gamma = Tr(X H X'D) / Tr(D - D X H X'D): the leave-one-out factor (see the module notes)."""
    return trace_xhxd / trace_d_minus_dxhxd


def printed_gamma(trace_xhxd: float, trace_d_minus_dxhxd: float, n: int) -> float:
    """gamma = Tr(X H X'D) as printed in the paper (section 6); wrong by a factor n v. For tests."""
    return trace_xhxd


#: The gamma normalisation the estimator uses (tests swap in ``printed_gamma``).
gamma_normalisation: Callable[[float, float, int], float] = corrected_gamma


def logistic_loss_derivatives(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """psi = -loss'(t) = y - sigmoid(t) and D = loss''(t) = sigmoid(t)(1 - sigmoid(t)), y in {0, 1}."""
    p = sigmoid(t)
    return y - p, p * (1.0 - p)


LOSS_DERIVATIVES = {"logistic": logistic_loss_derivatives}


def leverages(X: np.ndarray, curvature: np.ndarray, c: float) -> np.ndarray:
    """h_i = D_i [X H X']_ii with H = (X'DX + c I)^-1, in O(min(n, d)^2 max(n, d)).

    With Z = D^1/2 X, h = diag(Z (Z'Z + cI)^-1 Z') = diag(ZZ' (ZZ' + cI)^-1)
    = 1 - c diag((ZZ' + cI)^-1): a d x d factorisation when d < n, else n x n.
    """
    n, d = X.shape
    Z = X * np.sqrt(curvature)[:, None]
    if d < n:
        factor = cholesky(Z.T @ Z + c * np.eye(d), lower=True)
        W = solve_triangular(factor, Z.T, lower=True)
        return np.einsum("ij,ij->j", W, W)
    gram = Z @ Z.T
    gram[np.diag_indices(n)] += c
    factor = cholesky(gram, lower=True)
    inverse_factor = solve_triangular(factor, np.eye(n), lower=True)
    # diag((LL')^-1) = column sums of (L^-1)^2.
    return 1.0 - c * np.einsum("ij,ij->j", inverse_factor, inverse_factor)


def estimate_inner_product_squared(
    X: np.ndarray,
    y: np.ndarray,
    w_hat: np.ndarray,
    sigma_factor: np.ndarray,
    ridge: float,
    loss: str = "logistic",
    gamma: Callable[[float, float, int], float] | None = None,
) -> dict[str, float]:
    """Eq. (11): the estimate of <w*, w_hat>_Sigma^2 and its ingredients.

    ``sigma_factor`` is the lower Cholesky factor L of Sigma (Sigma = L L'),
    ``y`` is 0/1, ``ridge`` the lambda of g(w) = lambda / (2d) ||w||^2.
    ``gamma`` defaults to the module's ``gamma_normalisation``.
    """
    gamma_fn = gamma_normalisation if gamma is None else gamma
    n, d = X.shape
    t = X @ w_hat
    psi, curvature = LOSS_DERIVATIVES[loss](t, y)
    c = n * ridge / d  # n times the penalty's Hessian, lambda / d
    h = leverages(X, curvature, c)
    trace_xhxd = float(h.sum())
    trace_rest = float(np.dot(curvature, 1.0 - h))
    v = trace_rest / n
    g = float(gamma_fn(trace_xhxd, trace_rest, n))
    r2 = float(psi @ psi) / n
    residual = t - g * psi
    residual_sq = float(residual @ residual)
    psi_t = float(psi @ t)
    whitened = solve_triangular(sigma_factor, X.T @ psi, lower=True)  # Sigma^-1/2 X'psi, up to rotation
    numerator = (v / n * residual_sq + psi_t / n - g * r2) ** 2
    denominator = (
        float(whitened @ whitened) / n**2 + 2.0 * v / n * psi_t + v**2 / n * residual_sq - d / n * r2
    )
    estimate = numerator / denominator if denominator > 0 else math.nan
    return {
        "inner_product_squared": estimate,
        "gamma": g,
        "v": v,
        "r2": r2,
        "numerator": numerator,
        "denominator": denominator,
    }


def stationarity(X: np.ndarray, y: np.ndarray, w_hat: np.ndarray, ridge: float, loss: str = "logistic") -> float:
    """||grad|| / max(||loss term||, ||penalty term||) of (1/n) sum loss + lambda/(2d) ||w||^2 at w_hat.

    0 at the exact minimiser; 1 or more when w_hat is far from it.
    """
    n, d = X.shape
    psi, _ = LOSS_DERIVATIVES[loss](X @ w_hat, y)
    loss_term = -(X.T @ psi) / n
    penalty_term = ridge / d * w_hat
    scale = max(float(np.linalg.norm(loss_term)), float(np.linalg.norm(penalty_term)))
    return float(np.linalg.norm(loss_term + penalty_term)) / scale if scale > 0 else 0.0


def angle_from(inner_product_squared: float, sign: float, w_norm: float) -> tuple[float, float, bool]:
    """Eq. (13): theta = arccos(clip(sign sqrt(a2) / ||w_hat||_Sigma, -1, 1)); also cos(theta) and
    whether the estimate had to be clipped (a2 < 0, undefined, or above ||w_hat||_Sigma^2)."""
    a2 = inner_product_squared
    clipped = not (math.isfinite(a2) and 0.0 <= a2 <= w_norm**2)
    a2 = min(max(a2, 0.0), w_norm**2) if math.isfinite(a2) else 0.0
    cosine = float(np.clip(sign * math.sqrt(a2) / w_norm, -1.0, 1.0))
    return math.acos(cosine), cosine, clipped


def sign_from_holdout(
    u: np.ndarray, labels: np.ndarray, weights: np.ndarray, centered: bool = False
) -> tuple[int, float, float]:
    """Eq. (12): sign(sum_i u_i y_i) with 0/1 labels (weighted), the statistic's weighted mean,
    and its margin as a z-score (mean over its standard error).

    ``centered``: sum_i u_i (y_i - mean y) instead. Both have mean Cov(u, y) under the
    model (E u = 0), but the centred one drops the noise of sum_i u_i times the base
    rate: at section 7.1's setting (70% positives, 100 holdout points) its wrong-sign
    rate is below 0.01% against about 1% for eq. (12) as printed.
    """
    total = float(weights.sum())
    if centered:
        labels = labels - float(np.dot(weights, labels)) / total
    products = u * labels
    mean = float(np.dot(weights, products)) / total
    effective_n = total**2 / float(np.dot(weights, weights))
    variance = float(np.dot(weights, (products - mean) ** 2)) / total
    standard_error = math.sqrt(variance / effective_n) if variance > 0 else 0.0
    z = mean / standard_error if standard_error > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
    return int(np.sign(mean)), mean, z


def platt_equivalent(theta: float, w_norm: float, scale: float, offset: float) -> tuple[float, float]:
    """Theorem 5.1, eq. (9): for a probit link F(u) = Phi(a u + b), the angular predictor equals
    F(A u + B) with A = cos(theta) / (||w_hat||_Sigma sqrt(1 + a^2 sin^2 theta)) and
    B = (b / a)(1 / sqrt(1 + a^2 sin^2 theta) - 1)."""
    root = math.sqrt(1.0 + scale**2 * math.sin(theta) ** 2)
    return math.cos(theta) / (w_norm * root), offset / scale * (1.0 / root - 1.0)


@lru_cache(maxsize=16)
def _hermite_rule(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights for E[f(Z)], Z ~ N(0, 1): sqrt(2) x_k and w_k / sqrt(pi) of Gauss-Hermite."""
    x, w = np.polynomial.hermite.hermgauss(nodes)
    return math.sqrt(2.0) * x, w / math.sqrt(math.pi)


def _trapezoid_rule(spread: float) -> tuple[np.ndarray, np.ndarray]:
    """Equally spaced z on [-9, 9], step 1.3 / spread, weighted by the normal density."""
    step = min(0.5, TRAPEZOID_STEP / spread)
    half = math.ceil(9.0 / step)
    z = step * np.arange(-half, half + 1)
    return z, step * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def quadrature_rule(spread: float, nodes: int = DEFAULT_QUADRATURE_NODES) -> tuple[str, np.ndarray, np.ndarray]:
    """The rule for E[f(m + spread Z)] with f logistic-like (poles at distance pi from the real axis).

    Gauss-Hermite with n nodes has error about exp(-2 pi sqrt(n) / spread), below
    1e-6 while spread <= sqrt(n / 4.84) (2.9 at 40 nodes: the paper's sigmoid(3u + 1)
    gives spread 3 sin(theta), about 2.6). Wider spreads, which a steep link
    gives, need nodes growing as spread^2; there the trapezoid rule on z, whose
    error is about exp(-2 pi^2 / (spread h)), reaches 1e-6 with step
    h = 1.3 / spread, that is 14 spread nodes.
    """
    if GH_NODES_PER_SPREAD_SQUARED * spread**2 <= nodes:
        return ("gauss-hermite", *_hermite_rule(nodes))
    return ("trapezoid", *_trapezoid_rule(spread))


def normal_expectation(
    function: Callable[[np.ndarray], np.ndarray], mean: np.ndarray, spread: float, nodes: int = DEFAULT_QUADRATURE_NODES
) -> np.ndarray:
    """E_Z[function(mean + spread Z)], Z ~ N(0, 1), elementwise over ``mean``, by ``quadrature_rule``;
    rows are taken in blocks so that memory stays bounded."""
    if spread == 0.0:
        return function(mean)
    _, points, weights = quadrature_rule(spread, nodes)
    shifts = spread * points
    out = np.empty(mean.shape[0], dtype=np.float64)
    block = max(1, (1 << 18) // shifts.shape[0])
    for start in range(0, mean.shape[0], block):
        stop = start + block
        # Summed along each row by numpy, not BLAS's matrix-vector product, whose order of
        # addition depends on a row's place in the block: a row's answer is the same in any batch.
        out[start:stop] = (function(mean[start:stop, None] + shifts[None, :]) * weights).sum(axis=1)
    return out


def expected_link(mean: np.ndarray, spread: float, family: str, nodes: int = DEFAULT_QUADRATURE_NODES) -> np.ndarray:
    """E_Z[F(mean + spread Z)], Z ~ N(0, 1), elementwise over ``mean``: Phi(mean / sqrt(1 + spread^2))
    exactly for the probit link, quadrature for the logistic one."""
    if family == "probit":
        return ndtr(mean / math.sqrt(1.0 + spread**2))
    return np.clip(normal_expectation(sigmoid, mean, spread, nodes), 0.0, 1.0)


def fit_ridge_logistic(
    X: np.ndarray, y: np.ndarray, ridge: float, tol: float = 1e-10, max_iter: int = 100
) -> np.ndarray:
    """w_hat = argmin_w (1/n) sum_i logistic loss(y_i, x_i'w) + ridge / (2d) ||w||^2, y in {0, 1}.

    The paper's estimator in the convention this module expects, by damped
    Newton steps: the d x d Hessian when d <= n, else through the n x n
    Woodbury form. It stops when a full step moves w by less than ``tol``
    (relative), i.e. at machine-precision stationarity.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, d = X.shape
    c = ridge / d
    gram = X @ X.T if d > n else None
    w = np.zeros(d)

    def objective(w: np.ndarray) -> float:
        t = X @ w
        return float(np.mean(np.logaddexp(0.0, t) - y * t)) + 0.5 * c * float(w @ w)

    value = objective(w)
    for _ in range(max_iter):
        p = sigmoid(X @ w)
        gradient = X.T @ (p - y) / n + c * w
        curvature = p * (1.0 - p) / n
        if gram is None:
            hessian = (X * curvature[:, None]).T @ X
            hessian[np.diag_indices(d)] += c
            factor = cholesky(hessian, lower=True)
            step = solve_triangular(factor.T, solve_triangular(factor, gradient, lower=True), lower=False)
        else:
            s = np.sqrt(curvature)
            inner = s[:, None] * gram * s[None, :]
            inner[np.diag_indices(n)] += c
            factor = cholesky(inner, lower=True)
            correction = s * solve_triangular(factor.T, solve_triangular(factor, s * (X @ gradient), lower=True))
            step = (gradient - X.T @ correction) / c
        if np.max(np.abs(step)) <= tol * (1.0 + np.max(np.abs(w))):
            return w - step  # a full Newton step this small is below the objective's rounding
        scale = 1.0
        while True:
            candidate = w - scale * step
            candidate_value = objective(candidate)
            if candidate_value <= value + 1e-12 * abs(value) or scale < 1e-10:
                break
            scale *= 0.5
        w, value = candidate, candidate_value
    return w


# -- the cache of the holdout-independent part of a fit -------------------------

_CACHE_SIZE = 8
_cache: OrderedDict[tuple, dict[str, float]] = OrderedDict()
_cache_lock = threading.Lock()


def _fingerprint(arrays: dict[str, np.ndarray | None], *extra: Any) -> tuple:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = arrays[name]
        digest.update(f"{name}:{None if array is None else array.shape};".encode())
        if array is not None:
            digest.update(np.ascontiguousarray(array, dtype="<f8").data)
    return (digest.hexdigest(), *extra)


def _cached(key: tuple, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return dict(_cache[key])
    result = compute()
    with _cache_lock:
        _cache[key] = dict(result)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return result


# -- the calibrator -----------------------------------------------------------


# scikit-learn estimator checks that need a fit from scores and labels alone.
ANGULAR_FITTING_CHECKS = (
    "check_all_zero_sample_weights_error", "check_estimators_dtypes", "check_estimators_fit_returns_self",
    "check_estimators_nan_inf", "check_estimators_overwrite_params", "check_estimators_pickle",
    "check_fit_check_is_fitted", "check_fit_idempotent", "check_pipeline_consistency",
    "check_positive_only_tag_during_fit", "check_readonly_memmap_input", "check_sample_weights_list",
    "check_sample_weights_not_an_array", "check_sample_weights_pandas_series",
)


class AngularCalibrator(Calibrator):
    """Angular calibration: f(u) = E_Z[F(a (cos(theta) u / ||w_hat||_Sigma + sin(theta) Z) + b)].

    The exact P(y = 1 | u = w_hat'x) for x ~ N(0, Sigma) and labels P(y = 1 | x) = F(a w*'x + b),
    the mean over Z ~ N(0, 1) by Gauss-Hermite quadrature (closed form for probit). theta, the
    angle between w* and w_hat in the Sigma geometry, is estimated from the training data (its
    magnitude, eq. 11) and the holdout (its sign, eq. 12). ``fit`` takes, beside the holdout's
    logits and labels, the training design ``X``, labels ``y`` and weights ``w_hat``, and
    ``Sigma`` or ``X_unlabeled`` to estimate it.

    Parameters
    ----------
    input : {"logit"}, default="logit"
        Scores are the linear classifier's logits u = w_hat'x.
    ridge : float, default=None
        The ridge penalty lambda w_hat was trained with, in the convention lambda / (2d) ||w||^2
        beside the mean loss (scikit-learn: ``LogisticRegression(C=d / (n lambda),
        fit_intercept=False)``). Required, > 0; the service's option is named ``lambda``.
    loss : {"logistic"}, default="logistic"
        The training loss.
    link : dict or str, default=None
        ``{"family": "logistic" | "probit", "scale": a, "offset": b}``, or the family's name;
        None is logistic, scale 1, offset 0.
    quadrature_nodes : int, default=40
        Gauss-Hermite nodes for the logistic link (2 to 200).
    max_dimension : int, default=5000
        The largest d accepted (at most 20000): the fit factorises d x d matrices.
    stationarity_tol : float or None, default=0.1
        How far from the ridge objective's minimiser w_hat may be (relative gradient norm);
        None skips the check.
    sign_estimator : {"centered", "paper"}, default="centered"
        The sign of <w*, w_hat>: sign(sum u_i (y_i - mean y)), or eq. (12) as printed.

    Attributes
    ----------
    theta_ : float
        The estimated angle between w* and w_hat in the Sigma geometry.
    w_norm_sigma_ : float
        ||w_hat||_Sigma.
    sign_ : int
        The estimated sign of <w*, w_hat>_Sigma.
    inner_product_, inner_product_squared_ : float
        The estimates of <w*, w_hat>_Sigma and its square (eq. 11).
    sign_statistic_ : float
        The holdout statistic whose sign is ``sign_`` (a weighted mean of u (y - mean y), or
        of u y for ``sign_estimator="paper"``).
    sign_margin_ : float
        That statistic over its standard error: how clearly the holdout decides the sign.
    diagnostics_ : dict
        What the fit measured (gamma, stationarity, clipping).

    References
    ----------
    Y. Li and P. Sur, "Optimal and provable calibration in high-dimensional binary
    classification: angular calibration and Platt scaling" (papers/000). The derivation and
    calibd's correction of the printed gamma: docs/methods/angular.md.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import LogisticRegression
    >>> from calibd.calibration.angular import AngularCalibrator
    >>> rng = np.random.default_rng(0)
    >>> n, d, lam = 400, 100, 0.5
    >>> w_star = rng.normal(size=d)
    >>> X = rng.normal(size=(n, d)) / np.sqrt(d)  # x ~ N(0, Sigma), Sigma = I / d
    >>> w_star *= np.sqrt(d) / np.linalg.norm(w_star)  # ||w*||_Sigma = 1
    >>> y = rng.binomial(1, 1 / (1 + np.exp(-X @ w_star)))
    >>> w_hat = LogisticRegression(C=d / (n * lam), fit_intercept=False, tol=1e-10).fit(X, y).coef_[0]
    >>> X_holdout = rng.normal(size=(200, d)) / np.sqrt(d)
    >>> y_holdout = rng.binomial(1, 1 / (1 + np.exp(-X_holdout @ w_star)))
    >>> calibrator = AngularCalibrator(ridge=lam).fit(
    ...     X_holdout @ w_hat, y_holdout, X=X, y=y, w_hat=w_hat, Sigma=np.eye(d) / d)
    >>> round(calibrator.theta_, 2)  # the true angle: 0.94
    1.03
    >>> calibrator.predict([-2.0, 0.0, 2.0]).round(3)  # the truth: 0.05, 0.5, 0.95
    array([0.073, 0.5  , 0.927])
    """

    method = "angular"
    inputs = ("logit",)
    # Non-decreasing in u only when cos(theta) >= 0, which the holdout decides.
    monotone = False
    fit_arrays = {
        "X": ArraySpec(ndim=2, rows=False, description="the training design X (n x d) w_hat was fitted on"),
        "y": ArraySpec(ndim=1, rows=False, description="the training labels (n,), 0/1"),
        "w_hat": ArraySpec(ndim=1, rows=False, description="the fitted weights (d,)"),
        "Sigma": ArraySpec(ndim=2, rows=False, required=False, description="the covariance of x (d x d)"),
        "X_unlabeled": ArraySpec(
            ndim=2, rows=False, required=False, description="unlabeled rows of x (m x d, m >= d) to estimate Sigma"
        ),
    }
    fitted_attributes = (
        "theta_",
        "w_norm_sigma_",
        "sign_",
        "inner_product_",
        "inner_product_squared_",
        "sign_statistic_",
        "sign_margin_",
        "diagnostics_",
    )

    # ``lambda`` (the documented option) sets ``ridge``.
    option_aliases = {"lambda": "ridge"}

    def __init__(
        self,
        input: str = "logit",
        ridge: float | None = None,
        loss: str = "logistic",
        link: dict[str, Any] | str | None = None,
        quadrature_nodes: int = DEFAULT_QUADRATURE_NODES,
        max_dimension: int = DEFAULT_MAX_DIMENSION,
        stationarity_tol: float | None = 0.1,
        sign_estimator: str = "centered",
    ):
        self.input = input
        self.ridge = ridge
        self.loss = loss
        self.link = link
        self.quadrature_nodes = quadrature_nodes
        self.max_dimension = max_dimension
        self.stationarity_tol = stationarity_tol
        self.sign_estimator = sign_estimator

    def fit(self, scores: Any, labels: Any, sample_weight: Any = None, **arrays: Any) -> AngularCalibrator:  # type: ignore[override]
        """Fit on the holdout (``scores`` u = w_hat'x, ``labels``) given the training ``X``,
        ``y`` and ``w_hat`` by name: those names are taken, so the holdout keeps its own."""
        return self._fit_holdout(scores, labels, sample_weight, arrays)

    def expected_failed_checks(self) -> dict[str, str]:
        """Every check that fits: they pass scores and labels, not the training design."""
        needs = (
            "angular needs the training design X, y and w_hat (and the option lambda) beside the "
            "holdout; the check passes only X and y (tests/test_angular.py tests its fit)"
        )
        expected = super().expected_failed_checks() | dict.fromkeys(ANGULAR_FITTING_CHECKS, needs)
        del expected["check_fit1d"]  # refused, as the check expects (for want of lambda)
        expected["check_fit_score_takes_y"] = (
            "angular's extra arrays are named X and y (the training design and labels), "
            "so its holdout arguments are named scores and labels"
        )
        return expected

    def link_parameters(self) -> tuple[str, float, float]:
        """(family, scale a, offset b) of the label link, defaults filled in."""
        link = self.link
        if link is None:
            return "logistic", 1.0, 0.0
        if isinstance(link, str):
            return link, 1.0, 0.0
        return link.get("family", "logistic"), float(link.get("scale", 1.0)), float(link.get("offset", 0.0))

    def _check_params(self) -> None:
        if self.ridge is None:
            raise CalibrationInputError(
                "options.lambda",
                "required: the ridge penalty w_hat was trained with, g(w) = lambda/(2d)·||w||² beside the mean loss",
            )
        if not _is_number(self.ridge) or not (math.isfinite(self.ridge) and self.ridge > 0):
            raise CalibrationInputError("options.lambda", "must be a positive number")
        if self.loss not in LOSSES:
            raise CalibrationInputError("options.loss", f"must be one of: {', '.join(LOSSES)}")
        self._check_link()
        nodes = self.quadrature_nodes
        if not _is_integer(nodes) or not 2 <= nodes <= 200:
            raise CalibrationInputError("options.quadrature_nodes", "must be an integer from 2 to 200")
        limit = self.max_dimension
        if not _is_integer(limit) or not 1 <= limit <= MAX_DIMENSION_CEILING:
            raise CalibrationInputError("options.max_dimension", f"must be an integer from 1 to {MAX_DIMENSION_CEILING}")
        tol = self.stationarity_tol
        if tol is not None and (not _is_number(tol) or not (math.isfinite(tol) and tol > 0)):
            raise CalibrationInputError("options.stationarity_tol", "must be a positive number, or null to skip the check")
        if self.sign_estimator not in SIGN_ESTIMATORS:
            raise CalibrationInputError("options.sign_estimator", f"must be one of: {', '.join(SIGN_ESTIMATORS)}")

    def _check_link(self) -> None:
        link = self.link
        if link is None:
            return
        if isinstance(link, str):
            if link not in LINK_FAMILIES:
                raise CalibrationInputError("options.link", f"family must be one of: {', '.join(LINK_FAMILIES)}")
            return
        if not isinstance(link, dict):
            raise CalibrationInputError("options.link", 'must be {"family": ..., "scale": a, "offset": b}')
        for key in link:
            if key not in ("family", "scale", "offset"):
                raise CalibrationInputError(f"options.link.{key}", "unknown key (accepted: family, scale, offset)")
        if link.get("family", "logistic") not in LINK_FAMILIES:
            raise CalibrationInputError("options.link.family", f"must be one of: {', '.join(LINK_FAMILIES)}")
        scale, offset = link.get("scale", 1.0), link.get("offset", 0.0)
        if not _is_number(scale) or not (math.isfinite(scale) and scale > 0):
            raise CalibrationInputError("options.link.scale", "must be a positive number (P(y=1|x) = F(a·w*'x + b), a > 0)")
        if not _is_number(offset) or not math.isfinite(offset):
            raise CalibrationInputError("options.link.offset", "must be a finite number")

    # -- fit ------------------------------------------------------------------
    def _fit(
        self,
        scores: np.ndarray,
        labels: np.ndarray,
        weights: np.ndarray,
        X: np.ndarray,
        y: np.ndarray,
        w_hat: np.ndarray,
        Sigma: np.ndarray | None = None,
        X_unlabeled: np.ndarray | None = None,
    ) -> None:
        n, d = X.shape
        if d > self.max_dimension:
            raise CalibrationInputError(
                "X",
                f"has {d} columns, above the limit of {self.max_dimension} features (options.max_dimension; "
                f"at most {MAX_DIMENSION_CEILING})",
            )
        if n < 2:
            raise CalibrationInputError("X", "needs at least 2 training rows")
        y = _training_labels(y, n)
        if w_hat.shape[0] != d:
            raise CalibrationInputError("w_hat", f"has {w_hat.shape[0]} entries but X has {d} columns")
        if not np.any(w_hat):
            raise CalibrationInputError("w_hat", "must not be zero: the angle to a zero vector is undefined")
        if (Sigma is None) == (X_unlabeled is None):
            detail = "give Sigma or X_unlabeled, not both" if Sigma is not None else (
                "required: give Sigma (the d x d covariance of x) or X_unlabeled (unlabeled rows of x to estimate it)"
            )
            raise CalibrationInputError("Sigma", detail)
        # Cheap shape checks before any O(d^3) work.
        if Sigma is not None and Sigma.shape != (d, d):
            raise CalibrationInputError("Sigma", f"has shape {Sigma.shape[0]} x {Sigma.shape[1]} but X has {d} columns")
        if X_unlabeled is not None:
            if X_unlabeled.shape[1] != d:
                raise CalibrationInputError("X_unlabeled", f"has {X_unlabeled.shape[1]} columns but X has {d}")
            if X_unlabeled.shape[0] < d:
                raise CalibrationInputError(
                    "X_unlabeled", f"has {X_unlabeled.shape[0]} rows; estimating a {d} x {d} Sigma needs at least {d}"
                )
        if Sigma is not None:
            _check_symmetric(Sigma)

        ridge = float(self.ridge)
        key = _fingerprint(
            {"X": X, "y": y, "w_hat": w_hat, "Sigma": Sigma, "X_unlabeled": X_unlabeled},
            ridge, self.loss, gamma_normalisation,
        )
        magnitude = _cached(key, lambda: self._magnitude(X, y, w_hat, Sigma, X_unlabeled, ridge))
        tol = self.stationarity_tol
        if tol is not None and magnitude["stationarity"] > tol:
            raise CalibrationInputError(
                "w_hat",
                f"is not the minimiser of (1/n)·Σ {self.loss} loss + lambda/(2d)·||w||² with lambda = {ridge:g}: "
                f"the gradient there is {magnitude['stationarity']:.3g} of its terms' size (stationarity_tol "
                f"{tol:g}). Check lambda's convention (scikit-learn: C = d/(n·lambda), fit_intercept=False), "
                "the labels y, and fit w_hat to a tight tolerance",
            )

        centered = self.sign_estimator == "centered"
        sign, statistic, margin = sign_from_holdout(scores, labels.astype(np.float64), weights, centered)
        w_norm = magnitude["w_norm_sigma"]
        theta, cosine, clipped = angle_from(magnitude["inner_product_squared"], sign, w_norm)
        self.theta_ = theta
        self.w_norm_sigma_ = w_norm
        self.sign_ = sign
        self.inner_product_ = cosine * w_norm
        self.inner_product_squared_ = _json_float(magnitude["inner_product_squared"])
        self.sign_statistic_ = statistic
        self.sign_margin_ = _json_float(margin)
        self.diagnostics_ = {
            "clipped": clipped,
            "gamma": magnitude["gamma"],
            "v": magnitude["v"],
            "r2": magnitude["r2"],
            "stationarity": magnitude["stationarity"],
            "n_train": n,
            "dimension": d,
            "sigma_from": "Sigma" if Sigma is not None else "X_unlabeled",
            "n_holdout": int(scores.shape[0]),
        }

    def _magnitude(
        self,
        X: np.ndarray,
        y: np.ndarray,
        w_hat: np.ndarray,
        Sigma: np.ndarray | None,
        X_unlabeled: np.ndarray | None,
        ridge: float,
    ) -> dict[str, float]:
        """Everything of the fit that does not depend on the holdout."""
        if Sigma is not None:
            sigma = (Sigma + Sigma.T) / 2.0
            field = "Sigma"
        else:
            sigma = X_unlabeled.T @ X_unlabeled / X_unlabeled.shape[0]
            field = "X_unlabeled"
        try:
            factor = cholesky(sigma, lower=True)
        except LinAlgError:
            detail = "must be positive definite" if field == "Sigma" else (
                "its rows' second-moment matrix is singular (rows must span all d directions)"
            )
            raise CalibrationInputError(field, detail) from None
        w_norm_sq = float(np.sum((factor.T @ w_hat) ** 2))
        result = estimate_inner_product_squared(X, y, w_hat, factor, ridge, self.loss)
        result["w_norm_sigma"] = math.sqrt(w_norm_sq)
        result["stationarity"] = stationarity(X, y, w_hat, ridge, self.loss)
        return result

    # -- predict --------------------------------------------------------------
    def _predict(self, scores: np.ndarray) -> np.ndarray:
        family, scale, offset = self.link_parameters()
        s = scores / self.w_norm_sigma_
        mean = scale * math.cos(self.theta_) * s + offset
        return expected_link(mean, scale * math.sin(self.theta_), family, self.quadrature_nodes)

    def fit_info(self) -> dict[str, Any]:
        return {
            "angle": self.theta_,
            "angle_degrees": math.degrees(self.theta_),
            "inner_product": self.inner_product_,
            "inner_product_squared": self.inner_product_squared_,
            "w_hat_norm_sigma": self.w_norm_sigma_,
            "sign": self.sign_,
            "sign_statistic": self.sign_statistic_,
            "sign_margin": self.sign_margin_,
            "sign_estimator": self.sign_estimator,
            **self.diagnostics_,
        }


# -- helpers ------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _json_float(value: float) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return float(value) if math.isfinite(value) else None


def _training_labels(y: np.ndarray, n: int) -> np.ndarray:
    """0/1 training labels as floats; -1/+1 labels are converted (-1 -> 0)."""
    if y.shape[0] != n:
        raise CalibrationInputError("y", f"has {y.shape[0]} entries but X has {n} rows")
    values = np.unique(y)
    if np.all(np.isin(values, (-1.0, 1.0))) and -1.0 in values:
        y = (y > 0).astype(np.float64)
        values = np.unique(y)
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        raise CalibrationInputError("y", "training labels must be 0 or 1 (or -1 and +1)", (int(np.flatnonzero(bad)[0]),))
    if values.shape[0] < 2:
        raise CalibrationInputError("y", f"both classes are needed in the training labels, but every label is {int(values[0])}")
    return y


def _check_symmetric(Sigma: np.ndarray) -> None:
    asymmetry = np.abs(Sigma - Sigma.T)
    bound = SYMMETRY_TOLERANCE * max(float(np.max(np.abs(Sigma))), np.finfo(float).tiny)
    if np.any(asymmetry > bound):
        i, j = np.unravel_index(int(np.argmax(asymmetry)), asymmetry.shape)
        raise CalibrationInputError("Sigma", f"must be symmetric: Sigma[{i}][{j}] != Sigma[{j}][{i}]", (int(i), int(j)))
