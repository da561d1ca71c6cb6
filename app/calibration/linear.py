"""Linear maps of logits or log-probabilities, followed by a softmax: vector
scaling, matrix scaling and Dirichlet calibration.

    p' = softmax(W x + b)

* ``vector``: x the logits, W = diag(a) (a per-class scale and a bias).
  Guo, Pleiss, Sun & Weinberger (2017), "On calibration of modern neural
  networks", section 4.2.
* ``matrix``: x the logits, W a full K x K matrix, with ODIR regularisation.
* ``dirichlet``: x = log p, the log-probabilities (for logit input,
  log softmax(z)); W full, diagonal, or fixed-diagonal (W = a I: one scale
  shared by all classes, with the per-class bias b, which is what makes it
  differ from temperature scaling). Kull, Perello-Nieto, Kängsepp, Silva
  Filho, Song & Flach (2019), "Beyond temperature scaling: obtaining
  well-calibrated multi-class probabilities with Dirichlet calibration"
  (NeurIPS): the map softmax(W ln p + b) is the posterior of class-conditional
  Dirichlet distributions.

On logits and log-probabilities: log p = z - logsumexp(z) differs from z by a
per-row constant, which softmax ignores only when it is multiplied by a
vector proportional to 1. So vector/matrix scaling of logits and diagonal/full
Dirichlet calibration are different models on logit input, and the same
models on probability input (where the logits are log p; the only difference
is then the regulariser).

Fitting minimises the weighted mean log-loss plus a penalty,

    sum_i w_i [logsumexp(eta_i) - eta_{i, y_i}] / sum_i w_i + penalty(W, b),
    eta_i = W x_i + b,

by L-BFGS (scipy ``L-BFGS-B``, analytic gradients: with G = dL/deta =
w (softmax(eta) - onehot(y)), dL/dW = G^T X and dL/db = the column sums of G),
computed in row blocks of about 2 MB so that the several passes per
evaluation stay in cache. Start: the identity map followed by temperature
scaling, W = I / T, b = 0 (T fitted first by ``fit_inverse_temperature``, a
few passes); every variant contains that point and it is never worse than
the identity itself. The optimiser sees the parameters through an exact
linear change of variables that centres and scales each class's scale and
bias by the curvature of the log-loss at the start (see ``_fit``), which cuts
the iterations several-fold; it stops when the gradient in those units is
below 1e-3 / sqrt(n_eff), a thousandth of a parameter's standard error
(n_eff = (sum w)^2 / sum w^2), or after ``max_iter`` iterations
(``fit_info()["optimizer"]`` says which).

Penalties (Kull et al. 2019, section 4, with their normalisation), lambda =
``reg_lambda`` and mu = ``reg_mu``:

* ``odir`` (off-diagonal and intercept regularisation):
  lambda / (K (K - 1)) * sum_{i != j} W_ij^2 + mu / K * sum_k b_k^2.
  The diagonal is free, so the penalty pulls toward a class-wise rescaling,
  not toward uniform outputs. Diagonal variants have no off-diagonal, so only
  the mu term acts.
* ``l2``: lambda * mean of the squared free weights (all of W for ``full``,
  the K diagonal scales, or the single scale), pulling toward 0 as in the
  paper's Dir-L2, + mu / K * sum_k b_k^2.

softmax(W x + b) does not change when a constant is added to every b_k or
(full W) a vector to every row of W; the penalty is applied to the
equivalent point with the smallest penalty (``_canonical``), and that point
is what is stored, so the loss is exactly flat along those directions and the
stored parameters are identifiable (biases centred).

Defaults. Kull et al. choose lambda and mu by cross-validation (pass them as options). Without it the
defaults must be safe, and the room to overfit grows with the K (K - 1) off-diagonal entries, so the
default lambda for ``odir`` is K (K - 1); mu defaults to 1e-3; for ``l2``, lambda defaults to 1e-3 (a
penalty toward 0 on the diagonal pulls toward uniform outputs, so it stays weak). The held-out figures
behind these choices are in docs/methods/linear.md.

The intercept penalty also keeps a class absent from the holdout finite: its
bias would otherwise run to -infinity; with it, the bias settles where the
class's mean predicted probability balances 2 mu |b_k| / K.

Limits: the full variants have K^2 + K parameters and each evaluation costs
O(n K^2); they accept at most ``MAX_FULL_CLASSES`` = 200 classes and raise a
CalibrationInputError on ``scores`` beyond (use ``vector`` or
``dirichlet`` with ``variant="diagonal"``, O(n K), which take K up to any size
memory allows).
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np

from ._multiclass import (
    as_logits,
    fit_inverse_temperature,
    log_loss_residual,
    log_softmax,
    minimize_lbfgs,
    row_blocks,
    softmax,
)
from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import state_array, state_number

#: The largest K the full K x K variants accept.
MAX_FULL_CLASSES = 200
VARIANTS = ("full", "diagonal", "fixed_diagonal")
REGULARIZATIONS = ("odir", "l2")
#: reg_mu unless given (Kull et al.'s normalisation: mu / K * sum b_k^2).
DEFAULT_REG_MU = 1e-3
#: reg_lambda for "l2" unless given (lambda * mean of the squared weights).
DEFAULT_L2_LAMBDA = 1e-3
DEFAULT_MAX_ITER = 500


def _check_strength(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value) or value < 0:
        raise CalibrationInputError(field, "must be a finite number >= 0")


def _curvature_moments(x: np.ndarray, w: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column j: the total curvature R_j = sum_i w_i p_ij (1 - p_ij) of the
    log-loss at p = softmax(beta x), and the mean and variance of x_ij under
    the weights w_i p_ij (1 - p_ij)."""
    k = x.shape[1]
    total = np.zeros(k)
    first = np.zeros(k)
    second = np.zeros(k)
    for block in row_blocks(x.shape[0], k):
        xb = x[block]
        r = softmax(beta * xb)
        r *= 1.0 - r
        r *= w[block, None]
        total += r.sum(axis=0)
        r *= xb
        first += r.sum(axis=0)
        second += np.einsum("ij,ij->j", r, xb)
    safe = np.where(total > 0, total, 1.0)
    m = first / safe
    return total, m, np.maximum(second / safe - m * m, 0.0)


class LinearCalibrator(Calibrator):
    """A linear map then a softmax: p' = softmax(W x + b), x the logits or log-probabilities.

    The base of ``VectorScalingCalibrator``, ``MatrixScalingCalibrator`` and
    ``DirichletCalibrator``, which fix x and the form of W. (W, b) minimise the weighted mean
    log-loss plus the penalty of the module docstring (``odir`` or ``l2``), by L-BFGS from
    temperature scaling; the stored (W, b) is the equivalent point of least penalty.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on; probabilities enter as log p.

    Attributes
    ----------
    weights_ : ndarray of shape (K, K), (K,) or (1,)
        W: a full matrix, the diagonal, or one scale shared by every class.
    bias_ : ndarray of shape (K,)
        b, centred.
    reg_lambda_ : float
        The penalty strength lambda used (the option, or its default for K).

    References
    ----------
    M. Kull, M. Perello-Nieto, M. Kängsepp, T. Silva Filho, H. Song and P. Flach, "Beyond
    temperature scaling: obtaining well-calibrated multi-class probabilities with Dirichlet
    calibration", NeurIPS 2019.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.linear import LinearCalibrator, MatrixScalingCalibrator
    >>> calibrator = MatrixScalingCalibrator(input="logit").fit(logits, labels)
    >>> isinstance(calibrator, LinearCalibrator), calibrator.weights_.shape
    (True, (3, 3))
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)
    array([[0.674, 0.253, 0.073]])
    """

    tasks = ("multiclass",)
    monotone = False
    #: reg_lambda_ is the penalty strength used (``reg_lambda`` or its K-dependent default).
    fitted_attributes = ("weights_", "bias_", "reg_lambda_")
    #: "logit" (vector, matrix) or "log_probability" (dirichlet).
    features: ClassVar[str] = "logit"

    # Subclasses give these as options or fix them.
    variant: str
    regularization: str
    reg_lambda: float | None
    reg_mu: float
    max_iter: int

    def _check_state(self) -> None:
        k = int(self.n_classes_)
        weights = self.weights_
        ndim = weights.ndim if isinstance(weights, np.ndarray) and weights.ndim in (1, 2) else 2
        # A K x K map, K scales, or one scale shared by every class (fixed_diagonal).
        state_array(weights, "weights_", ndim=ndim, shape=(k,) * ndim if ndim == 2 or weights.shape != (1,) else (1,))
        state_array(self.bias_, "bias_", shape=(k,))
        state_number(self.reg_lambda_, "reg_lambda_", low=0.0)

    def _check_params(self) -> None:
        if self.reg_lambda is not None:
            _check_strength(self.reg_lambda, "options.reg_lambda")
        if self.variant not in VARIANTS:
            raise CalibrationInputError("options.variant", f"must be one of {', '.join(VARIANTS)}")
        if self.regularization not in REGULARIZATIONS:
            raise CalibrationInputError("options.regularization", f"must be one of {', '.join(REGULARIZATIONS)}")
        _check_strength(self.reg_mu, "options.reg_mu")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, Integral) or not 1 <= self.max_iter <= 100_000:
            raise CalibrationInputError("options.max_iter", "must be an integer from 1 to 100000")

    def _features(self, scores: np.ndarray) -> np.ndarray:
        x = as_logits(scores, self.input)
        if self.features == "log_probability" and self.input == "logit":
            x = log_softmax(x)
        return x

    def _linear(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """eta = W x + b for every row, into ``out``."""
        if self.variant == "full":
            eta = np.matmul(x, weights.T, out=out)
        else:
            eta = np.multiply(x, weights if self.variant == "diagonal" else weights[0], out=out)
        eta += bias
        return eta

    def _resolve_lambda(self, k: int) -> float:
        if self.reg_lambda is not None:
            return float(self.reg_lambda)
        if self.variant != "full" and self.regularization == "odir":
            return 0.0  # no off-diagonal to penalise
        # ODIR: K (K - 1), a weight of 1 on the plain sum of squared off-diagonal entries.
        return float(k * (k - 1)) if self.regularization == "odir" else DEFAULT_L2_LAMBDA

    def _canonical(self, weights: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The equivalent (W, b) with the smallest penalty.

        softmax(W x + b) does not change when a constant c is added to every
        b_k, nor (full W) when a vector v is added to every row of W. Along
        those directions the log-loss is flat; the canonical point is where
        the penalty is smallest: b centred, and for full W each column
        shifted so that its penalised entries (ODIR: off-diagonal; L2: all)
        have mean 0.
        """
        bias = bias - bias.mean()
        if self.variant == "full":
            k = bias.shape[0]
            if self.regularization == "odir":
                shift = (weights.sum(axis=0) - np.diag(weights)) / (k - 1)
            else:
                shift = weights.mean(axis=0)
            weights = weights - shift[None, :]
        return weights, bias

    def _penalty(self, weights: np.ndarray, bias: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """The penalty at the canonical point of (W, b), and its gradients in W (the free weights) and b.

        Penalising the canonical point makes the objective exactly flat along
        the directions that do not change the output, so the optimiser never
        spends iterations on them; by the envelope theorem the gradient is
        the penalty's gradient at the canonical point.
        """
        weights, bias = self._canonical(weights, bias)
        k = bias.shape[0]
        lam, mu = float(self.reg_lambda_), float(self.reg_mu)
        value = mu / k * float(bias @ bias)
        grad_b = 2.0 * mu / k * bias
        grad_w = np.zeros_like(weights)
        if self.regularization == "l2":
            value += lam * float(np.mean(weights**2))
            grad_w = 2.0 * lam / weights.size * weights
        elif self.variant == "full":
            off = weights.copy()
            np.fill_diagonal(off, 0.0)
            value += lam / (k * (k - 1)) * float(np.sum(off**2))
            grad_w = 2.0 * lam / (k * (k - 1)) * off
        return value, grad_w, grad_b

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        n, k = scores.shape
        if self.variant == "full" and k > MAX_FULL_CLASSES:
            alternative = "method 'vector'" if self.method == "matrix" else "variant 'diagonal'"
            raise CalibrationInputError(
                "scores",
                f"{self.method} with a full {k} x {k} matrix supports at most {MAX_FULL_CLASSES} classes; use {alternative}",
            )
        self.reg_lambda_ = self._resolve_lambda(k)
        x = self._features(scores)
        w = weights / weights.sum()
        # Start at W = I / T, b = 0: the identity followed by temperature
        # scaling (T fitted first, a few passes), a point of every variant
        # at least as good as the identity itself.
        beta, _ = fit_inverse_temperature(x, labels, w)
        # Precondition by a change of variables fitted at that start. With
        # curvature weights r_ij = w_i p_ij (1 - p_ij), R_k = sum_i r_ik, and
        # m_j, s_j^2 the r-weighted mean and variance of feature j,
        #   W_kj = U_kj / S_kj,  b_k = c_k / q_k - sum_j W_kj m_j,
        #   S_kj^2 = R_k s_j^2 + (the penalty's curvature in W_kj),  q_k^2 = R_k + 2 mu / K
        # (fixed diagonal: a = u / S, S^2 = sum_k R_k s_k^2 + ...): the diagonal of the
        # objective's Hessian in (U, c) is then about 1 and each class's scale and
        # bias are decorrelated, so L-BFGS needs far fewer iterations. The map
        # from (U, c) to (W, b) is exact; only the optimiser sees (U, c).
        curvature, m, variance = _curvature_moments(x, w, beta)
        s = np.sqrt(variance)
        s = np.where(s > 1e-6 * (1.0 + np.abs(m)), s, 1.0)
        # The penalty's own curvature joins the data's (it dominates the
        # off-diagonal entries under the default ODIR strength).
        lam, mu = self.reg_lambda_, float(self.reg_mu)
        q = np.sqrt(np.maximum(curvature + 2.0 * mu / k, 1e-16))
        if self.variant == "full":
            penalty_curvature = np.full((k, k), 2.0 * lam / (k * k if self.regularization == "l2" else k * (k - 1)))
            if self.regularization == "odir":
                np.fill_diagonal(penalty_curvature, 0.0)
            scale = np.sqrt(np.outer(curvature, variance) + penalty_curvature)
        elif self.variant == "diagonal":
            scale = np.sqrt(curvature * variance + (2.0 * lam / k if self.regularization == "l2" else 0.0))
        else:
            scale = np.array([np.sqrt(float(curvature @ variance) + (2.0 * lam if self.regularization == "l2" else 0.0))])
        scale = np.where(scale > 1e-8, scale, 1.0)
        if self.variant == "full":
            u0 = (np.diag(np.diag(scale)) * beta).ravel()
        else:
            u0 = scale * beta
        c0 = q * m * beta
        n_weights = u0.shape[0]
        blocks = row_blocks(n, k)
        buffer = np.empty((blocks[0].stop - blocks[0].start, k))

        def natural(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(W, b) from the optimiser's (U, c)."""
            u, c = theta[:n_weights], theta[n_weights:]
            if self.variant == "full":
                wts = u.reshape(k, k) / scale
                return wts, c / q - wts @ m
            wts = u / scale
            return wts, c / q - (wts * m if self.variant == "diagonal" else wts[0] * m)

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            wts, bias = natural(theta)
            loss = 0.0
            grad_w = np.zeros_like(wts)
            grad_b = np.zeros(k)
            for block in blocks:
                xb = x[block]
                eta = self._linear(xb, wts, bias, out=buffer[: xb.shape[0]])
                part, g = log_loss_residual(eta, labels[block], w[block])
                loss += part
                grad_b += g.sum(axis=0)
                if self.variant == "full":
                    grad_w += g.T @ xb
                elif self.variant == "diagonal":
                    grad_w += np.einsum("ij,ij->j", g, xb)
                else:
                    grad_w += np.einsum("ij,ij->", g, xb)
            penalty, pen_w, pen_b = self._penalty(wts, bias)
            grad_w += pen_w
            grad_b += pen_b
            # Chain rule through the change of variables.
            if self.variant == "full":
                grad_u = (grad_w - np.outer(grad_b, m)) / scale
            elif self.variant == "diagonal":
                grad_u = (grad_w - grad_b * m) / scale
            else:
                grad_u = (grad_w - grad_b @ m) / scale
            return loss + penalty, np.concatenate([grad_u.ravel(), grad_b / q])

        # In these coordinates a parameter's standard error is about
        # 1 / sqrt(n_eff); stop when the gradient (about the distance to the
        # optimum) is a thousandth of that.
        n_eff = 1.0 / float(np.einsum("i,i->", w, w))
        gtol = 1e-3 / np.sqrt(n_eff)
        theta, self.optimizer_ = minimize_lbfgs(objective, np.concatenate([u0, c0]), self.max_iter, gtol)
        self.optimizer_["start_temperature"] = 1.0 / beta
        self.weights_, self.bias_ = self._canonical(*natural(theta))

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        weights = np.asarray(self.weights_, dtype=np.float64)
        return softmax(self._linear(self._features(scores), weights, np.asarray(self.bias_, dtype=np.float64)))

    def fit_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "features": self.features,
            "variant": self.variant,
            "regularization": self.regularization,
            "reg_lambda": float(self.reg_lambda_),
            "reg_mu": float(self.reg_mu),
            "bias": np.asarray(self.bias_).tolist(),
        }
        if self.variant != "full":
            info["scales"] = np.asarray(self.weights_).tolist()
        if hasattr(self, "optimizer_"):
            info["optimizer"] = self.optimizer_
        return info


class VectorScalingCalibrator(LinearCalibrator):
    """Vector scaling: p' = softmax(a * z + b), a per-class scale a and bias b on the logits z.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on; probabilities enter as z = log p.
    reg_mu : float, default=0.001
        mu, the strength of the penalty mu / K sum_k b_k^2 beside the mean log-loss (L-BFGS);
        it keeps the bias of a class absent from the holdout finite.
    max_iter : int, default=500
        The most L-BFGS iterations, 1 to 100000.

    Attributes
    ----------
    weights_ : ndarray of shape (K,)
        The scales a.
    bias_ : ndarray of shape (K,)
        The biases b, centred.
    reg_lambda_ : float
        0: vector scaling has no off-diagonal weights to penalise.

    References
    ----------
    C. Guo, G. Pleiss, Y. Sun and K. Weinberger, "On calibration of modern neural networks",
    ICML 2017 (section 4.2).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.linear import VectorScalingCalibrator
    >>> calibrator = VectorScalingCalibrator(input="logit").fit(logits, labels)
    >>> calibrator.weights_.round(3)  # the truth: 1 / T = 0.5
    array([0.46 , 0.495, 0.526])
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)
    array([[0.672, 0.257, 0.071]])
    """

    method = "vector"
    features = "logit"
    variant = "diagonal"
    regularization = "odir"
    reg_lambda = None

    def __init__(self, input: str = "probability", reg_mu: float = DEFAULT_REG_MU, max_iter: int = DEFAULT_MAX_ITER):
        self.input = input
        self.reg_mu = reg_mu
        self.max_iter = max_iter


class MatrixScalingCalibrator(LinearCalibrator):
    """Matrix scaling: p' = softmax(W z + b), W a full K x K matrix (K <= 200), ODIR-regularised.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on; probabilities enter as z = log p.
    reg_lambda : float or None, default=None
        lambda, the strength of the penalty lambda / (K (K - 1)) sum_{i != j} W_ij^2 beside the
        mean log-loss (L-BFGS); None is K (K - 1).
    reg_mu : float, default=0.001
        mu, the strength of the penalty mu / K sum_k b_k^2.
    max_iter : int, default=500
        The most L-BFGS iterations, 1 to 100000.

    Attributes
    ----------
    weights_ : ndarray of shape (K, K)
        W.
    bias_ : ndarray of shape (K,)
        b, centred.
    reg_lambda_ : float
        The lambda used.

    References
    ----------
    C. Guo, G. Pleiss, Y. Sun and K. Weinberger, "On calibration of modern neural networks",
    ICML 2017; ODIR: M. Kull et al., "Beyond temperature scaling", NeurIPS 2019.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.linear import MatrixScalingCalibrator
    >>> calibrator = MatrixScalingCalibrator(input="logit").fit(logits, labels)
    >>> np.diag(calibrator.weights_).round(3)  # the truth: W = I / T = 0.5 I
    array([0.464, 0.495, 0.522])
    >>> calibrator.predict([[2.0, 0.0, -2.0]]).round(3)
    array([[0.674, 0.253, 0.073]])
    """

    method = "matrix"
    features = "logit"
    variant = "full"
    regularization = "odir"

    def __init__(
        self,
        input: str = "probability",
        reg_lambda: float | None = None,
        reg_mu: float = DEFAULT_REG_MU,
        max_iter: int = DEFAULT_MAX_ITER,
    ):
        self.input = input
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu
        self.max_iter = max_iter


class DirichletCalibrator(LinearCalibrator):
    """Dirichlet calibration: p' = softmax(W log p + b), for logit input log p = log softmax(z).

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    variant : {"full", "diagonal", "fixed_diagonal"}, default="full"
        W a full K x K matrix (at most 200 classes), a diagonal, or a I (one scale, K biases).
    regularization : {"odir", "l2"}, default="odir"
        The penalty beside the mean log-loss (L-BFGS): ``"odir"`` on W's off-diagonal entries,
        ``"l2"`` on all of its free entries; both add mu / K sum_k b_k^2.
    reg_lambda : float or None, default=None
        lambda, the weight penalty's strength; None is K (K - 1) for ``"odir"`` (0 for the
        diagonal variants, which have no off-diagonal) and 0.001 for ``"l2"``.
    reg_mu : float, default=0.001
        mu, the intercept penalty's strength.
    max_iter : int, default=500
        The most L-BFGS iterations, 1 to 100000.

    Attributes
    ----------
    weights_ : ndarray of shape (K, K), (K,) or (1,)
        W, by ``variant``.
    bias_ : ndarray of shape (K,)
        b, centred.
    reg_lambda_ : float
        The lambda used.

    References
    ----------
    M. Kull, M. Perello-Nieto, M. Kängsepp, T. Silva Filho, H. Song and P. Flach, "Beyond
    temperature scaling: obtaining well-calibrated multi-class probabilities with Dirichlet
    calibration", NeurIPS 2019.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> logits = 3 * rng.normal(size=(600, 3))
    >>> p = np.exp(logits / 2); p /= p.sum(axis=1, keepdims=True)  # the truth: T = 2
    >>> labels = (rng.random((600, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> from calibd.calibration.linear import DirichletCalibrator
    >>> probabilities = np.exp(logits); probabilities /= probabilities.sum(axis=1, keepdims=True)
    >>> calibrator = DirichletCalibrator(variant="fixed_diagonal").fit(probabilities, labels)
    >>> calibrator.weights_.round(3)  # W = a I, the truth a = 1 / T = 0.5
    array([0.494])
    >>> calibrator.predict([[0.867, 0.117, 0.016]]).round(3)  # the truth: 0.665, 0.245, 0.09
    array([[0.678, 0.247, 0.075]])
    """

    method = "dirichlet"
    features = "log_probability"

    def __init__(
        self,
        input: str = "probability",
        variant: str = "full",
        regularization: str = "odir",
        reg_lambda: float | None = None,
        reg_mu: float = DEFAULT_REG_MU,
        max_iter: int = DEFAULT_MAX_ITER,
    ):
        self.input = input
        self.variant = variant
        self.regularization = regularization
        self.reg_lambda = reg_lambda
        self.reg_mu = reg_mu
        self.max_iter = max_iter
