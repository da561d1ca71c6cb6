"""Multivariate calibration with isotonic Bernstein polynomials (BernPolyFusion).

M classifiers score each row (M = 1 to 4); the labels are binary. The
calibrated probability of class 1 is a tensor-product Bernstein polynomial of
the scores' empirical CDFs,

    f(s) = sum_{k in {0..K}^M} beta_k  prod_m b_{k_m,K}(u_m),   u_m = F_m(s_m),
    b_{k,K}(u) = C(K, k) u^k (1 - u)^(K - k),

fitted by least squares (the Brier score) under the constraints of the
paper's theorem 1,

    beta non-decreasing along every grid axis,  beta_{0..0} >= 0,  beta_{K..K} <= 1,

which make f non-decreasing in every score and keep it in [0, 1] everywhere
on [0, 1]^M, not only at the holdout's rows (every beta then lies in [0, 1];
the basis is non-negative and sums to 1, and a partial derivative of f is a
non-negative combination of the coefficient differences along its axis).
Wang & Liu, "Multivariate Probability Calibration with Isotonic Bernstein
Polynomials" (IJCAI 2020). One degree K serves every coordinate, as in the
paper's family F_K: then degree elevation nests F_K in F_{K+1}, so a higher
degree never fits the training data worse.

Score map. Each coordinate goes to [0, 1] by the weighted empirical CDF of
the holdout's scores for that coordinate (section 5 of the paper), with the
mid-rank convention: at a distinct holdout score x_j,

    F(x_j) = (weight of holdout scores < x_j + half the weight at x_j) / total weight,

so tied scores share one value; F is linear between distinct holdout scores
and constant beyond the smallest and largest (F(x_1) = W_1 / 2W and
F(x_k) = 1 - W_k / 2W). That is the same map at fit and at predict time, so a
holdout row is predicted exactly as it was fitted. The map keeps at most
``max_knots`` (default 1000) of the points (x_j, F(x_j)) per coordinate: with
more distinct scores it keeps the points of the same piecewise-linear curve at
``max_knots`` equally spaced levels of F, which moves F by at most
1 / (max_knots - 1) anywhere (0.001; below the sampling error of the ECDF
itself, about 0.5 / sqrt(n), up to n = 250,000). So the stored map is at most
2 x 1000 numbers per coordinate, whatever n is: about 40 kB of JSON per
coordinate, where the sorted holdout would be 2 MB per coordinate at
n = 100,000. Only the order of the scores enters F, so "probability" and
"logit" inputs give the same calibrated values on the holdout (they differ
only in how F interpolates between holdout scores).

Fit. With Phi the n x (K+1)^M design matrix of the basis at the mapped
holdout and w the weights normalised to sum to 1, the problem is the convex
quadratic program

    minimise 1/2 beta' H beta - g' beta,   H = Phi' W Phi + lambda I,   g = Phi' W y + lambda ybar 1,

with P = (K+1)^M variables and M K (K+1)^(M-1) + 2 linear inequalities; n
enters only through H and g, formed once in O(n P^2). The ridge
lambda = ``ridge`` x trace(Phi' W Phi) / P (default ridge 1e-6) makes H
positive definite when some part of the grid has no data, and pulls such
coefficients towards the weighted mean label ybar rather than towards 0.
It is solved by a dense primal-dual interior-point method (Mehrotra's
predictor-corrector): each iteration factors H + A' D A, a P x P Cholesky
(A, the constraint matrix, has two non-zeros per row, so A' D A is added in
O(P M)). About 12-25 iterations reach a duality gap below 1e-11. The
iterate then gets a repair that makes the constraints hold exactly (a
running maximum along each grid axis, which keeps the other axes'
monotonicity, then a clip to [0, 1]; it moves beta by the solver's residual
infeasibility, about 1e-10), so the guarantee does not rest on a tolerance.

Why this solver: from K = 10 on it is the fastest of the solvers measured (an active-set method wins
by 1-2 ms only at the smallest grids), and it needs nothing beyond SciPy's LAPACK; the comparison is in
docs/methods/bernstein.md.

Degree. With ``degree`` null, K is chosen by 5-fold cross-validation on the
Brier score (stratified folds, seed 0), searching upwards K = 1, 2, ... up to
``max_degree`` and stopping 3 degrees after the last improvement. The
default ``max_degree`` depends on M (40, 20, 7, 4 for M = 1, 2, 3, 4) and is
cut where (K+1)^M would exceed ``max_coefficients``. Smooth calibration maps
stop the search early (K of 2 to 6 is typical at n = 1000); scores that
nearly separate the classes need a high degree for the sharp rise, since a
degree-K Bernstein basis function spreads over about 1/sqrt(K) of the
ECDF-mapped axis (measured on digits with 400 rows: K = 20 against K = 10
took the test ECE from 4.5% to 3.1%). The score map is fitted once on the
whole holdout (it uses no labels), so each fold's training Gram matrix is the
total one less the fold's, and a fold's out-of-fold Brier score is
beta' G_f beta - 2 beta' g_f + sum_f w y^2: one pass over the data per
candidate degree. The chosen K is then refitted on all rows. A ``degree``
(or ``max_degree``) whose (K+1)^M exceeds ``max_coefficients`` (default 1024,
at most 4096) is refused with an error on that option.

BLAS runs on one thread during a fit (when threadpoolctl, a scikit-learn dependency, is
importable): at these sizes OpenBLAS's threads cost more than they save (docs/methods/bernstein.md).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from scipy.linalg import get_lapack_funcs
from scipy.special import comb

from ..inputs import CalibrationInputError, as_float_array, check_sample_weight
from .base import Calibrator
from .validation import check_holdout, encode_labels
from .crossfit import stratified_folds
from .isotonic import interp_by_ratio
from ._threads import single_threaded_blas

#: The most classifier scores per row.
MAX_SCORES = 4
#: Default largest candidate degree for the cross-validated choice, by M.
DEFAULT_MAX_DEGREE = {1: 40, 2: 20, 3: 7, 4: 4}
#: The upward degree search stops this many degrees after the last improvement.
PATIENCE = 3
#: Highest degree accepted at all (the basis is exact in float64 well beyond it).
MAX_DEGREE = 100
DEFAULT_MAX_COEFFICIENTS = 1024
#: The largest max_coefficients a request may set: a (K+1)^M = 4096 fit already
#: holds a 134 MB Gram matrix, and a solve would take about a minute (the
#: Cholesky per iteration grows as P^3; P = 1296 took about 2 s per solve).
HARD_MAX_COEFFICIENTS = 4096
DEFAULT_MAX_KNOTS = 1000
CV_SPLITS = 5
CV_SEED = 0
_potrf, _potrs = get_lapack_funcs(("potrf", "potrs"), dtype=np.float64)

#: Rows per block when forming Gram matrices and predicting (bounds memory).
_BLOCK_ELEMENTS = 1 << 20


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# -- the score map ---------------------------------------------------------------
def ecdf_knots(column: np.ndarray, weights: np.ndarray, max_knots: int) -> tuple[np.ndarray, np.ndarray]:
    """Knots (x, F(x)) of the mid-rank weighted ECDF, at most ``max_knots`` of them."""
    keep = weights > 0
    x, w = column[keep], weights[keep]
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
    distinct = x[starts]
    mass = np.add.reduceat(w, starts)
    total = mass.sum()
    below = np.cumsum(mass) - mass
    levels = (below + 0.5 * mass) / total
    if distinct.shape[0] > max_knots:
        # Points of the same piecewise-linear curve at equally spaced levels.
        targets = np.linspace(levels[0], levels[-1], max_knots)
        at = np.interp(targets, levels, distinct)
        at[0], at[-1] = distinct[0], distinct[-1]
        strict = np.concatenate(([True], at[1:] > at[:-1]))
        distinct, levels = at[strict], targets[strict]
    return distinct, levels


def apply_ecdf(column: np.ndarray, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """F(s): linear between knots, constant outside them."""
    if x.shape[0] == 1:
        return np.full(column.shape[0], u[0])
    out = np.interp(column, x, u)
    bad = ~np.isfinite(out)  # knots subnormal-close: interpolate by ratio instead
    if bad.any():
        out[bad] = interp_by_ratio(column[bad], x, u)
    return out


# -- the Bernstein basis -----------------------------------------------------------
def bernstein_basis(u: np.ndarray, degree: int) -> np.ndarray:
    """b_{k,K}(u) for k = 0..K, shape (n, K+1); exact 0/1 at u = 0 and u = 1."""
    n = u.shape[0]
    powers = np.empty((n, degree + 1))
    co_powers = np.empty((n, degree + 1))
    powers[:, 0] = 1.0
    co_powers[:, 0] = 1.0
    v = 1.0 - u
    for k in range(1, degree + 1):
        powers[:, k] = powers[:, k - 1] * u
        co_powers[:, k] = co_powers[:, k - 1] * v
    return comb(degree, np.arange(degree + 1)) * powers * co_powers[:, ::-1]


def design_matrix(u: np.ndarray, degree: int) -> np.ndarray:
    """Rows of the tensor-product basis, shape (n, (K+1)^M); coordinate 0 varies slowest."""
    n, m = u.shape
    phi = bernstein_basis(u[:, 0], degree)
    for j in range(1, m):
        phi = (phi[:, :, None] * bernstein_basis(u[:, j], degree)[:, None, :]).reshape(n, -1)
    return phi


def evaluate(u: np.ndarray, coef: np.ndarray, degree: int) -> np.ndarray:
    """f(u) = sum_k beta_k prod_m b_{k_m}(u_m), contracting one coordinate at a time."""
    n, m = u.shape
    width = degree + 1
    out = np.empty(n)
    block = max(1, _BLOCK_ELEMENTS // width ** max(m - 1, 1))
    table = coef.reshape(width, -1)
    for start in range(0, n, block):
        part = u[start : start + block]
        acc = _contract(bernstein_basis(part[:, 0], degree)[:, :, None], table[None])  # (rows, (K+1)^(M-1))
        for j in range(1, m):
            acc = _contract(acc.reshape(part.shape[0], width, -1), bernstein_basis(part[:, j], degree)[:, :, None])
        out[start : start + block] = acc[:, 0]
    return out


def _contract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_k a[:, k, :] * b[:, k, :], k in order. Not a matrix product: BLAS may sum in an order that
    depends on how many rows it gets, and a row's value must not depend on its batch (Spark, /calibrate)."""
    acc = a[:, 0, :] * b[:, 0, :]
    for k in range(1, a.shape[1]):
        acc += a[:, k, :] * b[:, k, :]
    return acc


# -- the quadratic program ------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def grid_pairs(degree: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) flat indices of every pair of grid neighbours along an axis."""
    index = np.arange((degree + 1) ** m).reshape((degree + 1,) * m)
    lower = np.concatenate([np.take(index, np.arange(degree), axis=a).ravel() for a in range(m)])
    upper = np.concatenate([np.take(index, np.arange(1, degree + 1), axis=a).ravel() for a in range(m)])
    lower.flags.writeable = upper.flags.writeable = False
    return lower, upper


def repair(coef: np.ndarray, degree: int, m: int) -> np.ndarray:
    """Make the constraints hold exactly: running maxima along each axis, then [0, 1].

    A running maximum along one axis keeps every other axis non-decreasing
    (the maximum of ordered sequences is ordered), and clipping keeps order.
    """
    grid = coef.reshape((degree + 1,) * m)
    for axis in range(m):
        grid = np.maximum.accumulate(grid, axis=axis)
    return np.clip(grid, 0.0, 1.0).ravel()


def solve_monotone_qp(
    hessian: np.ndarray, linear: np.ndarray, degree: int, m: int, tol: float = 1e-11, max_iter: int = 100
) -> tuple[np.ndarray, int, bool]:
    """minimise 1/2 x'Hx - g'x subject to the Bernstein monotonicity constraints.

    Constraints A x >= b: x[upper] - x[lower] >= 0 for grid neighbours,
    x[0] >= 0 and -x[-1] >= -1. Primal-dual interior point with Mehrotra's
    predictor-corrector; slack s = A x - b >= 0, multipliers z >= 0.
    Returns (x repaired to feasibility, iterations, converged).
    """
    p = hessian.shape[0]
    lower, upper = grid_pairs(degree, m)
    n_diff = lower.shape[0]
    n_con = n_diff + 2
    b = np.zeros(n_con)
    b[-1] = -1.0
    diagonal = np.arange(p) * (p + 1)
    upper_lower = upper * p + lower
    lower_upper = lower * p + upper

    def a_times(x: np.ndarray) -> np.ndarray:
        return np.concatenate((x[upper] - x[lower], x[:1], -x[-1:]))

    def a_transpose(y: np.ndarray) -> np.ndarray:
        out = np.bincount(upper, y[:n_diff], minlength=p) - np.bincount(lower, y[:n_diff], minlength=p)
        out[0] += y[n_diff]
        out[-1] -= y[n_diff + 1]
        return out

    def normal_matrix(d: np.ndarray) -> np.ndarray:
        matrix = hessian.copy()
        flat = matrix.reshape(-1)
        dd = d[:n_diff]
        flat[diagonal] += np.bincount(upper, dd, minlength=p) + np.bincount(lower, dd, minlength=p)
        flat[upper_lower] -= dd  # each neighbour pair occurs once: no repeated indices
        flat[lower_upper] -= dd
        flat[0] += d[n_diff]
        flat[-1] += d[n_diff + 1]
        return matrix

    def step_length(v: np.ndarray, dv: np.ndarray) -> float:
        """The largest step in (0, 1] that keeps v + step * dv >= 0."""
        negative = dv < 0
        return min(1.0, float(np.min(-v[negative] / dv[negative]))) if negative.any() else 1.0

    x = np.full(p, 0.5)
    s = np.ones(n_con)
    z = np.ones(n_con)
    scale = max(1.0, float(np.abs(linear).max()))
    converged = False
    iterations = 0
    for iterations in range(1, max_iter + 1):
        r_dual = hessian @ x - linear - a_transpose(z)
        r_primal = a_times(x) - s - b
        gap = float(s @ z)
        if gap <= tol and np.abs(r_primal).max() <= 1e-9 and np.abs(r_dual).max() <= 10 * tol * scale:
            converged = True
            break
        matrix = normal_matrix(z / s)
        factor, info = _potrf(matrix, lower=1, clean=0, overwrite_a=1)
        if info != 0:
            matrix = normal_matrix(z / s)
            matrix.reshape(-1)[diagonal] += 1e-12 * float(np.trace(matrix)) / p
            factor, info = _potrf(matrix, lower=1, clean=0, overwrite_a=1)
            if info != 0:
                break

        def direction(r_comp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            rhs = -r_dual - a_transpose((r_comp + z * r_primal) / s)
            dx, _ = _potrs(factor, rhs, lower=1)
            ds = a_times(dx) + r_primal
            dz = -(r_comp + z * ds) / s
            return dx, ds, dz

        sz = np.concatenate((s, z))
        mu = gap / n_con
        dx, ds, dz = direction(s * z)
        alpha = step_length(sz, np.concatenate((ds, dz)))
        mu_affine = float((s + alpha * ds) @ (z + alpha * dz)) / n_con
        sigma = (mu_affine / mu) ** 3
        dx, ds, dz = direction(s * z + ds * dz - sigma * mu)
        alpha = 0.99 * step_length(sz, np.concatenate((ds, dz)))
        x += alpha * dx
        s += alpha * ds
        z += alpha * dz
        if not (np.isfinite(x).all() and s.min() > 0 and z.min() > 0):
            break
    return repair(x, degree, m), iterations, converged


def gram(u: np.ndarray, y: np.ndarray, w: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(Phi' W Phi, Phi' W y, sum w y^2, sum w) over the rows given, in blocks."""
    p = (degree + 1) ** u.shape[1]
    h = np.zeros((p, p))
    g = np.zeros(p)
    block = max(256, _BLOCK_ELEMENTS // p)
    for start in range(0, u.shape[0], block):
        phi = design_matrix(u[start : start + block], degree)
        root = np.sqrt(w[start : start + block])
        weighted = phi * root[:, None]
        h += weighted.T @ weighted
        g += phi.T @ (w[start : start + block] * y[start : start + block])
    return h, g, float(w @ (y * y)), float(w.sum())


def fit_coefficients(
    h: np.ndarray, g: np.ndarray, ybar: float, ridge: float, degree: int, m: int
) -> tuple[np.ndarray, int, bool]:
    """The constrained least-squares coefficients for the Gram matrices h, g."""
    p = h.shape[0]
    lam = ridge * max(float(np.trace(h)), 1e-300) / p
    hessian = h + lam * np.eye(p)
    return solve_monotone_qp(hessian, g + lam * ybar, degree, m)


def loss_from_gram(coef: np.ndarray, h: np.ndarray, g: np.ndarray, yy: float) -> float:
    """sum_i w_i (f(u_i) - y_i)^2 from the Gram matrices of those rows."""
    return float(coef @ h @ coef - 2.0 * coef @ g + yy)


class BernsteinCalibrator(Calibrator):
    """Bernstein calibration: f(s) = sum_k beta_k prod_m b_{k_m,K}(F_m(s_m)), beta monotone on the grid.

    M = 1 to 4 classifier scores per row, binary labels. F_m is the holdout's empirical CDF of
    score m, b_{k,K}(u) = C(K, k) u^k (1 - u)^(K - k), and beta minimises the (weighted) Brier
    score subject to beta non-decreasing along every grid axis, beta_0 >= 0 and beta_K <= 1, so
    f is non-decreasing in every score and within [0, 1] everywhere.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on (only their order enters F).
    degree : int or None, default=None
        K in every coordinate, 1 to 100; None chooses it by 5-fold cross-validated Brier score.
    max_degree : int or None, default=None
        The largest K, 1 to 100, that choice tries (upwards from 1, stopping 3 degrees after
        the last improvement); None is 40, 20, 7, 4 for M = 1, 2, 3, 4, cut at
        ``max_coefficients``.
    ridge : float, default=1e-6
        In (0, 1]: a ridge lambda = ridge * trace(Phi'W Phi) / (K+1)^M toward the mean label.
    max_coefficients : int, default=1024
        The largest (K+1)^M accepted, 2 to 4096.
    max_knots : int, default=1000
        The most ECDF points kept per score, 2 to 100000.

    Attributes
    ----------
    n_scores_ : int
        M.
    degree_ : int
        The K fitted.
    coef_ : ndarray of shape ((K+1)^M,)
        beta, in [0, 1].
    knots_x_, knots_u_ : ndarray
        The ECDF points (score, F) of every score column, one column after the other.
    knot_offsets_ : ndarray of shape (M + 1,)
        Where each column's points start and end in ``knots_x_`` and ``knots_u_``.
    cv_brier_ : dict
        The cross-validated Brier score of each degree tried (empty for a fixed degree).
    solver_ : dict
        The interior-point solver's iterations and whether it converged.

    References
    ----------
    Y. Wang and X. Liu, "Multivariate probability calibration with isotonic Bernstein
    polynomials", IJCAI 2020 (papers/002).

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.bernstein import BernsteinCalibrator
    >>> rng = np.random.default_rng(0)
    >>> truth = rng.uniform(0.05, 0.95, 1000)
    >>> scores = np.column_stack([truth**2, np.sqrt(truth)])  # two classifiers, each distorted
    >>> scores = np.clip(scores + 0.05 * rng.normal(size=(1000, 2)), 0, 1)
    >>> labels = rng.binomial(1, truth)
    >>> calibrator = BernsteinCalibrator().fit(scores, labels)
    >>> calibrator.degree_
    4
    >>> calibrator.predict([[0.04, 0.45], [0.25, 0.71], [0.64, 0.89]]).round(3)  # truth: 0.2, 0.5, 0.8
    array([0.206, 0.491, 0.791])
    """

    method = "bernstein"
    tasks = ("multivariate",)
    monotone = True
    fitted_attributes = (
        "n_scores_",
        "degree_",
        "coef_",
        "knots_x_",
        "knots_u_",
        "knot_offsets_",
        "cv_brier_",
        "solver_",
    )

    def __init__(
        self,
        input: str = "probability",
        degree: int | None = None,
        max_degree: int | None = None,
        ridge: float = 1e-6,
        max_coefficients: int = DEFAULT_MAX_COEFFICIENTS,
        max_knots: int = DEFAULT_MAX_KNOTS,
    ):
        self.input = input
        self.degree = degree
        self.max_degree = max_degree
        self.ridge = ridge
        self.max_coefficients = max_coefficients
        self.max_knots = max_knots

    # -- options ---------------------------------------------------------------
    def _check_params(self) -> None:
        for name in ("degree", "max_degree"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 1 <= value <= MAX_DEGREE):
                raise CalibrationInputError(f"options.{name}", f"must be null or an integer from 1 to {MAX_DEGREE}")
        if self.degree is not None and self.max_degree is not None:
            raise CalibrationInputError(
                "options.max_degree", "give degree (a fixed degree) or max_degree (the cross-validated range), not both"
            )
        ridge = self.ridge
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not (0 < ridge <= 1):
            raise CalibrationInputError("options.ridge", "must be a number in (0, 1]")
        cap = self.max_coefficients
        if not _is_int(cap) or not 2 <= cap <= HARD_MAX_COEFFICIENTS:
            raise CalibrationInputError(
                "options.max_coefficients", f"must be an integer from 2 to {HARD_MAX_COEFFICIENTS}"
            )
        if not _is_int(self.max_knots) or not 2 <= self.max_knots <= 100_000:
            raise CalibrationInputError("options.max_knots", "must be an integer from 2 to 100000")

    def candidate_degrees(self, n_scores: int) -> list[int]:
        """The degrees the fit will consider for M = n_scores; raises past max_coefficients."""
        cap = self.max_coefficients
        if self.degree is not None:
            self._check_count("options.degree", self.degree, n_scores)
            return [int(self.degree)]
        if self.max_degree is not None:
            self._check_count("options.max_degree", self.max_degree, n_scores)
            top = int(self.max_degree)
        else:
            top = DEFAULT_MAX_DEGREE[n_scores]
            while top > 1 and (top + 1) ** n_scores > cap:
                top -= 1
            self._check_count("options.max_coefficients", top, n_scores)
        return list(range(1, top + 1))

    def _check_count(self, field: str, degree: int, n_scores: int) -> None:
        count = (degree + 1) ** n_scores
        if count > self.max_coefficients:
            raise CalibrationInputError(
                field,
                f"degree {degree} with {n_scores} scores per row needs (K+1)^M = {count} coefficients, "
                f"more than max_coefficients = {self.max_coefficients} (at most {HARD_MAX_COEFFICIENTS})",
            )

    # -- input ---------------------------------------------------------------------
    def _check_multivariate(self, scores: Any, n_columns: int | None = None) -> np.ndarray:
        """Rows of M scores (a flat list is M = 1); M from 1 to MAX_SCORES; probabilities in [0, 1]."""
        array = as_float_array(scores, "scores", ndim=(1, 2))
        flat = array.ndim == 1
        if flat:
            array = array[:, None]
        m = array.shape[1]
        if not 1 <= m <= MAX_SCORES:
            raise CalibrationInputError(
                "scores", f"rows have {m} scores; bernstein takes from 1 to {MAX_SCORES} classifier scores per row", (0,)
            )
        if n_columns is not None and m != n_columns:
            raise CalibrationInputError(
                "scores", f"rows have {m} columns but this calibrator was fitted on {n_columns}", (0,)
            )
        if self.input == "probability":
            outside = (array < 0.0) | (array > 1.0)
            if outside.any():
                where = tuple(int(i) for i in np.argwhere(outside)[0])
                index = where[:1] if flat else where
                raise CalibrationInputError(
                    "scores", "probabilities must lie in [0, 1]; send input='logit' for raw scores", index
                )
        return array

    def check_holdout_arrays(
        self,
        scores: Any,
        labels: Any,
        sample_weight: Any = None,
        classes: list[Any] | None = None,
        max_samples: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any] | None]:
        """As the base class's, but rows of 1 to 4 scores (base.check_scores wants 2 or more columns)."""
        own_limit = getattr(self, "max_samples", None)
        limits = [v for v in (own_limit, max_samples) if v]
        if limits and hasattr(scores, "__len__") and len(scores) > min(limits):
            raise CalibrationInputError(
                "scores", f"{len(scores)} rows is more than {self.method} fits here (at most {min(limits)})"
            )
        array = self._check_multivariate(scores)
        if classes is not None:
            raise CalibrationInputError("classes", "bernstein takes binary 0/1 labels, not class names")
        codes, _ = encode_labels(labels, array.shape[0], 2)
        weights = check_sample_weight(sample_weight, array.shape[0])
        check_holdout(codes, weights, self.min_samples, 2)
        self.candidate_degrees(array.shape[1])  # refuse an oversized grid before fitting
        return array, codes, weights, None

    def check_predict_scores(self, scores: Any) -> np.ndarray:
        self._check_fitted()
        return self._check_multivariate(scores, self.n_columns_)

    def expected_failed_checks(self) -> dict[str, str]:
        wide = (
            f"bernstein takes 1 to {MAX_SCORES} scores per row (its basis has (degree + 1)^M terms); "
            "the check's X has 5 to 30 columns"
        )
        return super().expected_failed_checks() | dict.fromkeys(
            (
                "check_estimators_dtypes", "check_all_zero_sample_weights_error", "check_dtype_object",
                "check_sample_weight_equivalence_on_dense_data", "check_fit2d_1sample",
            ),
            wide,
        ) | {"check_fit1d": "a flat list is one score per row (M = 1) for bernstein; the check expects it refused"}

    @property
    def n_columns_(self) -> int:
        return int(self.n_scores_)

    # -- fit and predict -----------------------------------------------------------------
    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        if scores.ndim == 1:
            scores = scores[:, None]
        m = scores.shape[1]
        candidates = self.candidate_degrees(m)
        with single_threaded_blas():
            xs, us = [], []
            for j in range(m):
                x, u = ecdf_knots(scores[:, j], weights, int(self.max_knots))
                xs.append(x)
                us.append(u)
            self.n_scores_ = m
            self.knots_x_ = np.concatenate(xs)
            self.knots_u_ = np.concatenate(us)
            self.knot_offsets_ = np.cumsum([0] + [x.shape[0] for x in xs]).astype(np.float64)
            u = self._transform(scores)
            keep = weights > 0
            u, y, w = u[keep], labels[keep].astype(np.float64), weights[keep]
            w = w / w.sum()
            ybar = float(w @ y)
            cv_brier: dict[str, float] = {}
            cv_iterations = 0
            if len(candidates) > 1:
                folds = stratified_folds(labels[keep], CV_SPLITS, CV_SEED)
                best: tuple[float, int, np.ndarray, np.ndarray] | None = None
                for degree in candidates:
                    parts = [gram(u[folds == f], y[folds == f], w[folds == f], degree) for f in range(CV_SPLITS)]
                    h_all = sum(part[0] for part in parts)
                    g_all = sum(part[1] for part in parts)
                    loss = 0.0
                    for h_f, g_f, yy_f, w_f in parts:
                        if w_f <= 0 or w_f >= 1:
                            continue
                        # The fold's labelled mass is 1'g_f (the basis sums to 1).
                        ybar_train = (ybar - float(g_f.sum())) / (1.0 - w_f)
                        coef, iterations, _ = fit_coefficients(h_all - h_f, g_all - g_f, ybar_train, self.ridge, degree, m)
                        cv_iterations += iterations
                        loss += loss_from_gram(coef, h_f, g_f, yy_f)
                    cv_brier[str(degree)] = loss
                    if best is None or loss < best[0]:
                        best = (loss, degree, h_all, g_all)
                    elif degree >= best[1] + PATIENCE:
                        break
                assert best is not None
                _, chosen, h, g = best
            else:
                chosen = candidates[0]
                h, g, _, _ = gram(u, y, w, chosen)
            coef, iterations, converged = fit_coefficients(h, g, ybar, self.ridge, chosen, m)
        self.degree_ = int(chosen)
        self.coef_ = coef
        self.cv_brier_ = cv_brier
        self.solver_ = {
            "iterations": int(iterations),
            "converged": bool(converged),
            "cv_iterations": int(cv_iterations),
        }

    def _transform(self, scores: np.ndarray) -> np.ndarray:
        """Each score column through its holdout ECDF: (n, M) in [0, 1]."""
        offsets = np.asarray(self.knot_offsets_).astype(np.int64)
        x, levels = np.asarray(self.knots_x_), np.asarray(self.knots_u_)
        return np.column_stack(
            [apply_ecdf(scores[:, j], x[offsets[j] : offsets[j + 1]], levels[offsets[j] : offsets[j + 1]]) for j in range(scores.shape[1])]
        )

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        if scores.ndim == 1:
            scores = scores[:, None]
        u = self._transform(scores)
        return np.clip(evaluate(u, np.asarray(self.coef_, dtype=np.float64), int(self.degree_)), 0.0, 1.0)

    def fit_info(self) -> dict[str, Any]:
        offsets = np.asarray(self.knot_offsets_).astype(np.int64)
        info: dict[str, Any] = {
            "degree": int(self.degree_),
            "degree_choice": "5-fold cross-validated Brier score" if self.cv_brier_ else "fixed",
            "n_scores": int(self.n_scores_),
            "n_coefficients": int((self.degree_ + 1) ** self.n_scores_),
            "cv_brier": {k: float(v) for k, v in self.cv_brier_.items()},
            "solver": "primal-dual interior point (Mehrotra)",
            "solver_iterations": int(self.solver_["iterations"]),
            "solver_converged": bool(self.solver_["converged"]),
            "cv_solver_iterations": int(self.solver_["cv_iterations"]),
            "ecdf_knots": [int(b - a) for a, b in zip(offsets[:-1], offsets[1:])],
        }
        return info
