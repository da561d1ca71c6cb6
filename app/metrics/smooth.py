"""Smooth ECE (Błasiok & Nakkiran 2023, "Smooth ECE: principled reliability diagrams via kernel smoothing").

The residuals r_i = p_i - y_i are smoothed over the prediction axis with a
Gaussian kernel of bandwidth sigma, reflected at 0 and 1 so that no mass
leaks out of [0, 1]:

    rhat(t) = sum_i K(t, p_i) r_i / (sum_i K(t, p_i) + eps),   delta(t) = sum_i K(t, p_i) + eps
    smECE_sigma = sum_t |rhat(t)| delta(t) / sum_t delta(t)   over an even grid of t in [0, 1]

and sigma is the fixed point sigma* = smECE_sigma*, found by bisection: 1 if
smECE_1 > 1, else 10 halvings of [0, 1], keeping the interval where
smECE_sigma > sigma flips (a sigma below ``eps`` = 0.001 counts as satisfied).

This is a numpy/scipy re-implementation of PyPI ``relplot`` (``relplot.smECE``,
version 1.0.3, its default reflected-Gaussian kernel) with the same
discretisation, so the values agree to rounding error:

* the predictions are splatted onto a grid of m = max(2000, round(20/sigma)) // 2 + 1
  points by linear interpolation between the two nearest grid points;
* the grid is extended by its mirror images at both ends and convolved with
  the kernel exp(-(t - 1/2)^2 / (2 sigma^2)) / (sqrt(2 pi) sigma) sampled on
  the same m points, by FFT (relplot's direct ``np.convolve`` costs O(m^2)
  per bandwidth tried; the results differ by rounding only);
* the smoothed values are interpolated linearly onto max(round(10/sigma), 200)
  evaluation points, and eps = 1e-4 is added to the density.

Sample weights multiply each point's contribution; they are scaled to mean 1
first, so that eps means what it means for unit weights.
"""

from __future__ import annotations

import numpy as np
from scipy import fft

from .inputs import Prepared, binary_problems, prepare, resolve_target

MESH_POINTS = 200
DENSITY_EPS = 1e-4
SEARCH_EPS = 1e-3
SEARCH_STEPS = 10


def _splat(p: np.ndarray, values: np.ndarray, m: int) -> np.ndarray:
    position = p * (m - 1)
    bins = position.astype(np.intp)
    np.clip(bins, 0, m - 2, out=bins)
    frac = position - bins
    return np.bincount(bins, weights=(1.0 - frac) * values, minlength=m) + np.bincount(
        bins + 1, weights=frac * values, minlength=m
    )


def _kernel(m: int, sigma: float) -> np.ndarray:
    t = np.linspace(0.0, 1.0, m)
    k = np.exp(-(t - 0.5) * (t - 0.5) / (2 * sigma**2))
    return k / (np.sqrt(2 * np.pi) * sigma)


class _Grids:
    """The splatted residual and density grids of one grid size m, mirrored and Fourier-transformed once."""

    def __init__(self, p: np.ndarray, residual: np.ndarray, weight: np.ndarray, m: int):
        grids = np.stack((_splat(p, residual, m), _splat(p, weight, m)))
        extended = np.concatenate((grids[:, ::-1][:, :-1], grids, grids[:, ::-1][:, 1:]), axis=1)  # 3m - 2
        self.m = m
        self.length = fft.next_fast_len(4 * m - 3, real=True)
        self.spectrum = fft.rfft(extended, self.length, axis=1)

    def convolve(self, kernel: np.ndarray) -> np.ndarray:
        """Both grids convolved with the kernel ("valid" part), the m values relplot keeps."""
        m = self.m
        full = fft.irfft(self.spectrum * fft.rfft(kernel, self.length), self.length, axis=1)
        start = (m - 1) + m // 2
        return full[:, start : start + m]


def _interpolate(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    m = values.shape[0]
    size = 1 / (m - 1)
    index = (t * (m - 1)).astype(np.intp)
    np.clip(index, 0, m - 2, out=index)
    residual = (t - index * size) / size
    return values[index] * (1 - residual) + values[index + 1] * residual


def smooth_ece_at(p: np.ndarray, y: np.ndarray, w: np.ndarray | None, sigma: float, _cache: dict | None = None) -> float:
    """smECE at a fixed bandwidth ``sigma`` (relplot's ``smECE_sigma``) of one binary problem."""
    n_eval = max(round(10 / sigma), MESH_POINTS)
    t = np.linspace(0.0, 1.0, n_eval)
    m = max(2000, round(20 / sigma)) // 2 + 1
    grids = None if _cache is None else _cache.get(m)
    if grids is None:
        residual = p - y if w is None else (p - y) * w
        grids = _Grids(p, residual, np.ones_like(p) if w is None else w, m)
        if _cache is not None:
            _cache[m] = grids
    smoothed, density = grids.convolve(_kernel(m, sigma))
    smoothed = _interpolate(t, smoothed)
    density = _interpolate(t, density) + DENSITY_EPS
    rs = smoothed / density
    return float(np.sum(np.abs(rs) * density) / np.sum(density))


def smooth_ece_binary(p: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[float, float]:
    """(smECE, sigma*) of one binary problem, with relplot's bandwidth search."""
    if w is not None:
        w = w * (w.shape[0] / w.sum())
    grids: dict = {}  # the splatted grids depend on sigma only through m: reuse them

    def at(sigma: float) -> float:
        return smooth_ece_at(p, y, w, sigma, grids)

    def satisfied(sigma: float) -> bool:
        return sigma < SEARCH_EPS or sigma < at(sigma)

    if satisfied(1.0):
        sigma = 1.0
    else:
        start, end = 1.0, 0.0
        for _ in range(SEARCH_STEPS):
            mid = (start + end) / 2
            if satisfied(mid):
                end = mid
            else:
                start = mid
        sigma = start
    return at(sigma), sigma


def smooth_ece(probabilities, labels, sample_weight=None, target: str | None = None, return_sigma: bool = False):
    """Smooth ECE with relplot's automatic bandwidth; see the module docstring.

    With ``classwise`` the value (and sigma) is the mean over the classes.
    """
    data = prepare(probabilities, labels, sample_weight)
    target = resolve_target(data, target)
    value, sigma = smooth_ece_prepared(data, target)
    return (value, sigma) if return_sigma else value


def smooth_ece_prepared(data: Prepared, target: str) -> tuple[float, float]:
    results = [smooth_ece_binary(p, y, data.w) for p, y in binary_problems(data, target)]
    values, sigmas = zip(*results)
    return float(np.mean(values)), float(np.mean(sigmas))
