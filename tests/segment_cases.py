"""Synthetic multicalibration cases with known truth, shared by benchmarks/segments.py and the tests.

Each generator draws ``n`` rows: a base model's probability ``score`` (what a
calibrator receives), the true probability ``truth``, a label drawn from it, and
feature columns (``categorical``: strings; ``numeric``: floats). The base model
knows a latent logit ``f`` (the same in every case) and misses what the case
describes: segment effects it never saw, a wrong slope, a shift that changes
sign from one segment to another. Nothing here depends on calibd or mcgrad.

    case = CASES["interaction2"](20_000, np.random.default_rng(0))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Case:
    score: np.ndarray
    y: np.ndarray
    truth: np.ndarray
    categorical: dict[str, np.ndarray] = field(default_factory=dict)
    numeric: dict[str, np.ndarray] = field(default_factory=dict)

    def take(self, rows: np.ndarray) -> "Case":
        return Case(self.score[rows], self.y[rows], self.truth[rows],
                    {k: v[rows] for k, v in self.categorical.items()}, {k: v[rows] for k, v in self.numeric.items()})


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _labels(rng: np.random.Generator, truth_logit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    truth = _sigmoid(truth_logit)
    return truth, (rng.random(truth.shape[0]) < truth).astype(np.int64)


def _category(rng: np.random.Generator, n: int, name: str, weights: list[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes drawn with these relative weights, and their strings (name0, name1, ...)."""
    weights = np.asarray(weights, dtype=np.float64)
    codes = rng.choice(weights.shape[0], n, p=weights / weights.sum())
    return codes, np.array([f"{name}{k}" for k in range(weights.shape[0])])[codes]


def _latent(rng: np.random.Generator, n: int, mean: float = -1.0) -> np.ndarray:
    return rng.normal(mean, 1.5, n)


def interaction2(n: int, rng: np.random.Generator) -> Case:
    """Two 4-valued columns whose pairs (not their values alone) shift the truth."""
    f = _latent(rng, n)
    a, a_s = _category(rng, n, "a", [4, 3, 2, 1])
    b, b_s = _category(rng, n, "b", [1, 2, 3, 4])
    _, c_s = _category(rng, n, "c", [1, 1, 1])  # no effect
    effect = 0.9 * ((a == 0) & (b == 1)) - 0.8 * ((a == 1) & (b == 3)) + 0.6 * ((a == 2) & (b == 0)) - 0.5 * ((a == 3) & (b == 2))
    truth, y = _labels(rng, f + effect)
    return Case(_sigmoid(f), y, truth, {"a": a_s, "b": b_s, "c": c_s})


def interaction3(n: int, rng: np.random.Generator) -> Case:
    """Three 3-valued columns; two triples shift the truth, no pair or value does much alone."""
    f = _latent(rng, n)
    a, a_s = _category(rng, n, "a", [1, 1, 1])
    b, b_s = _category(rng, n, "b", [1, 1, 1])
    c, c_s = _category(rng, n, "c", [1, 1, 1])
    effect = 1.2 * ((a == 0) & (b == 1) & (c == 2)) - 1.0 * ((a == 2) & (b == 0) & (c == 1)) + 0.7 * ((a == 1) & (b == 2) & (c == 0))
    truth, y = _labels(rng, f + effect)
    return Case(_sigmoid(f), y, truth, {"a": a_s, "b": b_s, "c": c_s})


def thresholds(n: int, rng: np.random.Generator) -> Case:
    """Numeric columns with thresholds (age over 60, income under its 15th percentile) and a global slope error."""
    f = _latent(rng, n)
    age = rng.uniform(18, 90, n)
    income = rng.lognormal(10, 0.6, n)
    region, region_s = _category(rng, n, "r", [3, 2, 1])
    effect = 0.7 * (age > 60) - 0.6 * (income < np.exp(10 - 0.6)) + 0.3 * (region == 2)
    truth, y = _labels(rng, f + effect)
    return Case(_sigmoid(1.3 * f + 0.2), y, truth, {"region": region_s}, {"age": np.round(age, 1), "income": np.round(income, 2)})


def steps(n: int, rng: np.random.Generator) -> Case:
    """Numeric columns with steps (short tenure, a high second score) beside a categorical shift, and an
    underconfident base model: the development case of the numeric kind (``thresholds`` is held out)."""
    f = _latent(rng, n)
    tenure = rng.exponential(5.0, n)
    second = rng.normal(0.0, 1.0, n)
    channel, channel_s = _category(rng, n, "ch", [4, 3, 2, 1])
    effect = -0.5 * (tenure < 1.0) + 0.6 * (second > 1.0) + 0.35 * (channel == 1) - 0.25 * (channel == 3)
    truth, y = _labels(rng, f + effect)
    return Case(_sigmoid(0.8 * f - 0.15), y, truth, {"channel": channel_s},
                {"tenure": np.round(tenure, 2), "second": np.round(second, 3)})


def high_cardinality(n: int, rng: np.random.Generator) -> Case:
    """A 150-valued column with a long (Zipf) tail, each value its own effect, and a small second column."""
    f = _latent(rng, n)
    k = 150
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    effects = rng.normal(0.0, 0.5, k)
    city, city_s = _category(rng, n, "city", weights)
    dev, dev_s = _category(rng, n, "dev", [2, 1])
    truth, y = _labels(rng, f + effects[city] + 0.3 * (dev == 1))
    return Case(_sigmoid(f), y, truth, {"city": city_s, "device": dev_s})


def rare_segments(n: int, rng: np.random.Generator) -> Case:
    """Two rare flags (0.4% and 0.3% of rows) far off either way; a 5-valued column with no effect."""
    f = _latent(rng, n)
    promo, promo_s = _category(rng, n, "promo", [99.6, 0.4])
    fraud, fraud_s = _category(rng, n, "flag", [99.7, 0.3])
    _, other_s = _category(rng, n, "o", [1, 1, 1, 1, 1])
    truth, y = _labels(rng, f + 1.5 * (promo == 1) - 1.5 * (fraud == 1))
    return Case(_sigmoid(f), y, truth, {"promo": promo_s, "flag": fraud_s, "other": other_s})


def sign_flip(n: int, rng: np.random.Generator) -> Case:
    """The base model over-predicts in one country and under-predicts in another; overconfident on one device,
    underconfident on another, so no global correction helps."""
    f = _latent(rng, n)
    country, country_s = _category(rng, n, "country", [3, 3, 2, 2])
    device, device_s = _category(rng, n, "device", [1, 1, 1])
    shift = np.array([0.6, -0.6, 0.3, -0.3])[country]
    slope = np.array([1.4, 0.7, 1.0])[device]
    truth, y = _labels(rng, f)
    return Case(_sigmoid(slope * f + shift), y, truth, {"country": country_s, "device": device_s})


def low_base_rate(n: int, rng: np.random.Generator) -> Case:
    """About 1% positives; the base model misses a segment effect either way."""
    f = rng.normal(-5.0, 1.0, n)
    seg, seg_s = _category(rng, n, "s", [4, 3, 2, 1])
    dev, dev_s = _category(rng, n, "d", [1, 1])
    effect = np.array([0.0, 0.7, -0.6, 0.9])[seg] - 0.3 * (dev == 1)
    truth, y = _labels(rng, f + effect)
    return Case(_sigmoid(f), y, truth, {"segment": seg_s, "device": dev_s})


def calibrated(n: int, rng: np.random.Generator) -> Case:
    """The base model is the truth: already multicalibrated on columns that have no effect (nothing may get worse)."""
    f = _latent(rng, n)
    _, a_s = _category(rng, n, "a", [4, 3, 2, 1])
    _, b_s = _category(rng, n, "b", np.ones(30))
    truth, y = _labels(rng, f)
    return Case(truth, y, truth, {"a": a_s, "b": b_s}, {"x": rng.normal(0, 1, n)})


def label_noise(n: int, rng: np.random.Generator) -> Case:
    """Segment effects under heavy label noise: 15% of labels flipped (the truth includes the flips)."""
    f = _latent(rng, n)
    a, a_s = _category(rng, n, "a", [3, 2, 1])
    b, b_s = _category(rng, n, "b", [1, 1, 1, 1])
    clean = _sigmoid(f + 0.8 * (a == 1) - 0.6 * (b == 3) + 0.5 * ((a == 2) & (b == 0)))
    truth = 0.15 + 0.7 * clean  # P(y = 1) after flipping 15% of labels either way
    y = (rng.random(n) < truth).astype(np.int64)
    return Case(_sigmoid(f), y, truth, {"a": a_s, "b": b_s})


CASES: dict[str, Callable[[int, np.random.Generator], Case]] = {
    "interaction2": interaction2,
    "interaction3": interaction3,
    "thresholds": thresholds,
    "steps": steps,
    "high_cardinality": high_cardinality,
    "rare_segments": rare_segments,
    "sign_flip": sign_flip,
    "low_base_rate": low_base_rate,
    "calibrated": calibrated,
    "label_noise": label_noise,
}
