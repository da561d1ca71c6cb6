"""The two scales scores come on, and the conversions between them.

Every method accepts ``input="probability"`` (values in [0, 1]) or ``input="logit"`` (any
finite real) and converts to the scale it works on with :func:`to_logit` or
:func:`to_probability`.
"""

from __future__ import annotations

import numpy as np

INPUT_KINDS = ("probability", "logit")

# Probabilities are clipped to [EPS, 1 - EPS] before taking logits, so that a
# score of exactly 0 or 1 maps to a large but finite logit.
EPS = 1e-12


def to_logit(scores: np.ndarray, input: str) -> np.ndarray:
    """Scores on the logit scale: log(p / (1 - p)) for probabilities."""
    if input == "logit":
        return scores
    p = np.clip(scores, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def to_probability(scores: np.ndarray, input: str) -> np.ndarray:
    """Scores on the probability scale: the logistic sigmoid of logits."""
    if input == "probability":
        return scores
    return sigmoid(scores)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function, without overflow warnings for large |z|."""
    return np.exp(-np.logaddexp(0.0, -z))
