"""A small ReLU multilayer perceptron with one output, backpropagation by hand, and Adam.

Used by the selective calibrator as its selector. Pure numpy: no deep-learning
framework. The network maps ``X`` (n, f) to one real output per row,

    a_0 = X,   a_l = relu(a_{l-1} W_l + b_l)   (hidden layers),   s = a_L W_out + b_out,

and ``backward`` returns the exact gradient of ``sum_i d_i * s_i`` with respect
to every weight and bias, given ``d = dLoss/ds``. Parameters are a flat list
``[W_1, b_1, ..., W_out, b_out]`` of float64 arrays, so that they serialise as
nested lists and Adam can treat them uniformly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def init_mlp(n_inputs: int, hidden: Sequence[int], rng: np.random.Generator, output_bias: float = 0.0) -> list[np.ndarray]:
    """He-initialised weights (normal, std sqrt(2 / fan_in)), zero hidden biases.

    The output layer starts small (std 0.1 / sqrt(fan_in)) so that the
    initial output is close to ``output_bias`` for every row.
    """
    params: list[np.ndarray] = []
    fan_in = n_inputs
    for width in hidden:
        params.append(rng.normal(0.0, np.sqrt(2.0 / fan_in), size=(fan_in, width)))
        params.append(np.zeros(width))
        fan_in = width
    params.append(rng.normal(0.0, 0.1 / np.sqrt(fan_in), size=(fan_in, 1)))
    params.append(np.array([float(output_bias)]))
    return params


def forward(params: Sequence[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The outputs s, shape (n,), and the activations ``backward`` needs."""
    activations = [x]
    a = x
    for layer in range(0, len(params) - 2, 2):
        a = a @ params[layer]
        a += params[layer + 1]
        np.maximum(a, 0.0, out=a)
        activations.append(a)
    s = a @ params[-2]
    s += params[-1]
    return s[:, 0], activations


def predict(params: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The outputs s, shape (n,)."""
    return forward(params, x)[0]


def backward(params: Sequence[np.ndarray], activations: Sequence[np.ndarray], d_out: np.ndarray) -> list[np.ndarray]:
    """Gradients of sum_i d_out[i] * s_i with respect to each parameter, in ``params`` order."""
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    delta = d_out[:, None]
    n_layers = len(params) // 2
    for layer in reversed(range(n_layers)):
        a_in = activations[layer]
        weight = params[2 * layer]
        grads[2 * layer] = a_in.T @ delta
        grads[2 * layer + 1] = delta.sum(axis=0)
        if layer > 0:
            # a_in = relu(pre): its derivative is 1 where the unit is active (a_in > 0).
            delta = (delta @ weight.T) * (a_in > 0.0)
    return grads


class Adam:
    """Adam (Kingma & Ba 2015) with bias correction, updating parameters in place."""

    def __init__(self, params: Sequence[np.ndarray], learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.learning_rate = learning_rate
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, params: Sequence[np.ndarray], grads: Sequence[np.ndarray]) -> None:
        self.t += 1
        correction1 = 1.0 - self.beta1**self.t
        correction2 = 1.0 - self.beta2**self.t
        rate = self.learning_rate * np.sqrt(correction2) / correction1
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            v += (1.0 - self.beta2) * (g * g)
            p -= rate * m / (np.sqrt(v) + self.eps)
