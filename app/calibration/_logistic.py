"""Weighted logistic regression on a few features, by Newton's method.

Shared by the parametric calibrators (Platt, binary temperature, beta,
scaling-binning). With d features the Hessian is d x d, so each iteration is a
handful of vectorised passes over the data, and Newton converges in a few
iterations where a general-purpose optimiser would take dozens.
"""

from __future__ import annotations

import numpy as np


def logistic_loss(eta: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> float:
    """sum_i w_i [log(1 + e^eta_i) - t_i eta_i], the weighted negative log-likelihood."""
    return float(np.dot(weights, np.logaddexp(0.0, eta) - targets * eta))


def fit_logistic(
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray,
    init: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> np.ndarray:
    """Coefficients beta minimising the weighted log-loss of sigmoid(features @ beta).

    ``features`` is (n, d), ``targets`` in [0, 1] (soft targets allowed).
    Newton steps are halved until the loss decreases, so the iteration is
    monotone; it stops when a full step changes beta by less than ``tol``
    (relative). On separable data the optimum is at infinity and the loop
    stops at ``max_iter`` with a steep but finite fit.
    """
    n, d = features.shape
    beta = np.zeros(d) if init is None else np.asarray(init, dtype=np.float64).copy()
    eta = features @ beta
    loss = logistic_loss(eta, targets, weights)
    for _ in range(max_iter):
        p = np.exp(-np.logaddexp(0.0, -eta))
        gradient = features.T @ (weights * (p - targets))
        curvature = weights * p * (1.0 - p)
        hessian = (features * curvature[:, None]).T @ features
        hessian[np.diag_indices(d)] += 1e-12 * (np.trace(hessian) + 1.0)
        step = np.linalg.solve(hessian, gradient)
        # Near the optimum a full step changes the loss by less than its
        # rounding error, so "no worse" allows for that rounding.
        slack = 1e-12 * abs(loss)
        scale = 1.0
        while True:
            candidate = beta - scale * step
            candidate_eta = features @ candidate
            candidate_loss = logistic_loss(candidate_eta, targets, weights)
            if candidate_loss <= loss + slack or scale < 1e-10:
                break
            scale *= 0.5
        converged = scale * np.max(np.abs(step)) <= tol * (1.0 + np.max(np.abs(beta)))
        beta, eta, loss = candidate, candidate_eta, candidate_loss
        if converged:
            break
    return beta
