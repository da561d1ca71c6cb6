"""Shared pieces of the multiclass calibrators: logits, softmax, one-vs-rest
log-odds, the multiclass temperature fit, the weighted multinomial log-loss
with its gradient (in row blocks), L-BFGS, and packing per-class component
calibrators into flat arrays.

Conventions (every multiclass method follows them):

* Scores arrive validated, (n, K). With ``input="logit"`` they are used as
  logits. With ``input="probability"`` (rows already renormalised by
  ``check_scores``) the logits are ``log(max(p, 1e-12))`` (``base.EPS``, the
  clip the binary methods use too): a probability of exactly 0 becomes a logit
  of about -27.6, finite, 27.6 nats below a certain class. Softmax outputs are
  never rescaled directly: ``softmax(log p / T)`` is temperature scaling,
  ``p ** (1 / T)`` renormalised, not ``p / T``.
* Losses are the weighted *mean* log-loss, sum_i w_i l_i / sum_i w_i, so that
  regularisation strengths do not depend on n.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from scipy.optimize import minimize

from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import EPS
from .validation import state_array


def as_logits(scores: np.ndarray, input: str) -> np.ndarray:
    """Logits of validated (n, K) scores: the scores, or log(max(p, EPS))."""
    if input == "logit":
        return scores
    return np.log(np.maximum(scores, EPS))


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, z - logsumexp(z), without overflow."""
    shifted = z - z.max(axis=1, keepdims=True)
    shifted -= np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return shifted


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax; every row sums to 1 (up to rounding) and is finite."""
    out = z - z.max(axis=1, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)
    return out


def as_probabilities(scores: np.ndarray, input: str) -> np.ndarray:
    """What validated scores say as probabilities: the rows, or softmax of the logits."""
    return scores if input == "probability" else softmax(scores)


def one_vs_rest_logits(z: np.ndarray) -> np.ndarray:
    """log(p_k / (1 - p_k)) for p = softmax(z), every class k, computed stably.

    For k the row's top class, 1 - p_k is summed from the other classes
    directly (1 - p_k would cancel when p_k is near 1); for the others
    p_k <= 1/2 and log1p(-p_k) is accurate.
    """
    n, k = z.shape
    rows = np.arange(n)
    top = z.argmax(axis=1)
    m = z[rows, top]
    e = np.exp(z - m[:, None])
    total = e.sum(axis=1)
    log_total = np.log(total)
    log_p = z - m[:, None] - log_total[:, None]
    with np.errstate(divide="ignore"):  # the top entries (p may round to 1) are replaced below
        out = log_p - np.log1p(-np.exp(log_p))
    rest = total - 1.0  # the top entry contributes exactly e^0 = 1
    # rest can be 0 (one class infinitely ahead); floor it like a probability.
    out[rows, top] = -np.log(np.maximum(rest, EPS))
    return out


#: Rows per block in the fitting loops: blocks of about 2 MB stay in cache, so
#: the several passes each evaluation makes over a block cost little memory
#: traffic. Within a block every operation is vectorised.
BLOCK_ELEMENTS = 1 << 18


def row_blocks(n: int, k: int) -> list[slice]:
    """Consecutive row slices of about BLOCK_ELEMENTS entries each."""
    rows = max(1, BLOCK_ELEMENTS // max(k, 1))
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


#: Bounds of the multiclass temperature.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 1e3


def fit_inverse_temperature(
    z: np.ndarray, labels: np.ndarray, weights: np.ndarray, tol: float = 1e-10, max_iter: int = 100
) -> tuple[float, int]:
    """beta = 1/T minimising the weighted mean log-loss of softmax(beta z), and the passes used.

    L(beta) = sum_i w_i [logsumexp(beta z_i) - beta z_{i, y_i}] is convex, with
    L' = sum_i w_i (E_{p_i}[z] - z_{i, y_i}) and L'' = sum_i w_i Var_{p_i}(z),
    p_i = softmax(beta z_i); one pass over the data gives both. Safeguarded
    Newton: a bracket on the optimum from the sign of L', bisection in
    log beta when a Newton step leaves it, beta in
    [1 / MAX_TEMPERATURE, 1 / MIN_TEMPERATURE] (a bound when the optimum lies
    beyond it).
    """
    n, k = z.shape
    w = weights / weights.sum()
    rows = np.arange(n)
    # Rows shifted so that their largest logit is 0: exp(beta * zc) <= 1 for beta > 0.
    row_max = z.max(axis=1)
    zc_y = z[rows, labels] - row_max
    blocks = row_blocks(n, k)
    shifted = np.empty((blocks[0].stop - blocks[0].start, k))
    scaled = np.empty_like(shifted)

    def derivatives(beta: float) -> tuple[float, float]:
        gradient = curvature = 0.0
        for block in blocks:
            zb = z[block]
            zc = np.subtract(zb, row_max[block, None], out=shifted[: zb.shape[0]])
            e = np.multiply(zc, beta, out=scaled[: zb.shape[0]])
            np.exp(e, out=e)
            s = e.sum(axis=1)
            e *= zc
            m1 = e.sum(axis=1) / s  # E_p[z]
            m2 = np.einsum("ij,ij->i", e, zc) / s  # E_p[z^2]
            wb = w[block]
            gradient += float(np.einsum("i,i->", wb, m1 - zc_y[block]))
            curvature += float(np.einsum("i,i->", wb, np.maximum(m2 - m1 * m1, 0.0)))
        return gradient, curvature

    lower, upper = math.log(1.0 / MAX_TEMPERATURE), math.log(1.0 / MIN_TEMPERATURE)
    lo, hi = lower, upper
    # Work in t = log beta, keeping lo < optimum < hi from the sign of L'.
    t = 0.0
    passes = 0
    for _ in range(max_iter):
        beta = math.exp(t)
        gradient, curvature = derivatives(beta)
        passes += 1
        if gradient == 0.0 or (t >= upper and gradient < 0) or (t <= lower and gradient > 0):
            break  # the optimum, or a bound the optimum lies beyond
        if gradient > 0:
            hi = t  # L increasing here: the optimum is at smaller beta
        else:
            lo = t
        # A Newton step in beta (a step past 0 divides beta by 4 instead); it
        # stops the iteration when it is below tol. Bisection in t when the
        # step leaves the bracket, except that a step past a bound not yet
        # tried goes to that bound.
        candidate = beta - gradient / curvature if curvature > 0 else (math.inf if gradient < 0 else 0.0)
        new_t = math.log(candidate) if candidate > 0 else t - math.log(4.0)
        if abs(new_t - t) <= tol:
            t = min(max(new_t, lower), upper)
            break
        if new_t >= hi:
            new_t = upper if hi == upper else 0.5 * (lo + hi)
        elif new_t <= lo:
            new_t = lower if lo == lower else 0.5 * (lo + hi)
        if hi - lo <= tol:
            t = new_t
            break
        t = new_t
    return math.exp(t), passes


def log_loss_residual(eta: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> tuple[float, np.ndarray]:
    """Weighted multinomial log-loss of softmax(eta) and its gradient in eta.

    The loss is sum_i w_i [logsumexp(eta_i) - eta_{i, y_i}]: with weights
    normalised to sum 1 over the whole holdout, a block's loss and gradient
    add up to the holdout's. ``eta`` (n, K) is overwritten with the gradient,
    w_i (softmax(eta_i) - onehot(y_i)), which is returned.
    """
    rows = np.arange(eta.shape[0])
    eta_y = eta[rows, labels]
    m = eta.max(axis=1)
    eta -= m[:, None]
    np.exp(eta, out=eta)
    s = eta.sum(axis=1)
    loss = float(np.einsum("i,i->", weights, np.log(s) + m - eta_y))
    eta *= (weights / s)[:, None]
    eta[rows, labels] -= weights
    return loss, eta


def minimize_lbfgs(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, max_iter: int, gtol: float
) -> tuple[np.ndarray, dict[str, Any]]:
    """scipy's L-BFGS-B with an analytic gradient (``fun`` returns value and gradient).

    Stops when the largest gradient entry is below ``gtol``, when the loss
    changes by less than 1e-12 relative, or after ``max_iter`` iterations;
    the returned dict says which, as JSON types.

    Only small vectors go through BLAS here (scipy's own), but note that a
    multi-threaded OpenBLAS on a busy machine makes every small BLAS call
    cost milliseconds (seen: a fit 7x slower than with OPENBLAS_NUM_THREADS=1).
    """
    result = minimize(
        fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": int(max_iter), "gtol": gtol, "ftol": 1e-12, "maxcor": 20}
    )
    info = {
        "converged": bool(result.success),
        "iterations": int(result.nit),
        "evaluations": int(result.nfev),
        "message": str(result.message),
        "objective": float(result.fun),
    }
    return result.x, info


# -- per-class components ---------------------------------------------------
#
# One-vs-rest and top-label calibrators hold one binary calibrator per class.
# Their learned arrays have different lengths per class (isotonic thresholds,
# histogram edges), so they are stored as one flat array per attribute plus a
# table of offsets: offsets[c, a] .. offsets[c + 1, a] is component c's slice of
# attribute a. Scalars (Platt's a_, b_) are slices of length 1.


def pack_components(
    components: list[Calibrator | None], names: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Flat arrays per attribute name, and the (len(components) + 1, len(names)) offsets.

    A ``None`` component (not fitted) gets empty slices.
    """
    values = {name: [] for name in names}
    lengths = np.zeros((len(components), len(names)), dtype=np.int64)
    for c, component in enumerate(components):
        for a, name in enumerate(names):
            part = np.atleast_1d(np.asarray(getattr(component, name), dtype=np.float64)) if component else np.empty(0)
            values[name].append(part)
            lengths[c, a] = part.shape[0]
    offsets = np.zeros((len(components) + 1, len(names)), dtype=np.int64)
    np.cumsum(lengths, axis=0, out=offsets[1:])
    flat = {name: np.concatenate(parts) if parts else np.empty(0) for name, parts in values.items()}
    return flat, offsets


def unpack_component(
    cls: type[Calibrator], input: str, names: tuple[str, ...], flat: dict[str, np.ndarray], offsets: np.ndarray, index: int
) -> Calibrator:
    """Component ``index`` rebuilt from ``pack_components`` output, ready for ``_predict``.

    Every attribute comes back as a 1-D array (a scalar as an array of one),
    which the components' ``_predict`` accept.
    """
    component = cls(input=input)
    offsets = np.asarray(offsets, dtype=np.int64)
    for a, name in enumerate(names):
        setattr(component, name, np.asarray(flat[name], dtype=np.float64)[offsets[index, a] : offsets[index + 1, a]])
    return component


def check_packed(
    calibrator: Calibrator,
    cls: type[Calibrator],
    input: str,
    names: tuple[str, ...],
    present: str,
    n_components: int,
    check_component: Callable[[Calibrator], None],
) -> None:
    """The learned state of components packed by ``pack_components``: the ``present`` flags
    (0 or 1, one per class); ``offsets_`` of shape (n_components + 1, len(names)), whole
    numbers from 0, in order, ending at the packed arrays' lengths; and ``check_component``
    on each component that has a part, whose errors point into the packed arrays."""
    flags = state_array(getattr(calibrator, present), present, within=(0.0, 1.0))
    if flags.shape[0] != calibrator.n_classes_:
        raise CalibrationInputError(f"state.{present}", f"has {flags.shape[0]} entries for {calibrator.n_classes_} classes")
    offsets = state_array(calibrator.offsets_, "offsets_", ndim=2, shape=(n_components + 1, len(names)), non_decreasing=True)
    flat = {name: state_array(getattr(calibrator, name), name) for name in names}
    ends = [flat[name].shape[0] for name in names]
    if (offsets[0] != 0).any() or (offsets[-1] != ends).any() or (offsets != np.floor(offsets)).any():
        raise CalibrationInputError("state.offsets_", f"must be whole numbers from 0 to the packed lengths {ends}")
    offsets = offsets.astype(np.int64)
    for index in np.flatnonzero((np.diff(offsets, axis=0) > 0).any(axis=1)):
        component = unpack_component(cls, input, names, flat, offsets, int(index))
        try:
            check_component(component)
        except CalibrationInputError as error:
            name = error.field.removeprefix("state.")
            where = error.index
            if name in names and where:  # from the component's part to the packed array
                where = (int(where[0] + offsets[index, names.index(name)]), *where[1:])
            raise CalibrationInputError(error.field, f"component {int(index)}: {error.detail}", where) from None
