"""Isotonic regression: the non-decreasing step function closest to the labels.

    m = argmin_{m_1 <= ... <= m_k}  sum_j W_j (ybar_j - m_j)^2

over the k distinct holdout scores s_1 < ... < s_k, where W_j is the total
weight of the rows tied at s_j and ybar_j their weighted mean label (ties are
pooled first, so tied scores always get one value). The solution is found by
pool-adjacent-violators: each m_j is the weighted mean label of the block of
adjacent scores it was pooled into. Zadrozny & Elkan (2002), "Transforming
classifier scores into accurate multiclass probability estimates"; the
algorithm is from Ayer et al. (1955) and Barlow et al. (1972), "Statistical
inference under order restrictions".

Prediction interpolates linearly between the first and last score of each
block and is clipped to the end values outside [s_1, s_k], exactly as
scikit-learn's ``IsotonicRegression(out_of_bounds="clip")``:

    p'(s) = interp(s, x_thresholds, y_thresholds)

Only those block boundary points are kept (scikit-learn's ``trim_duplicates``),
so the stored state is at most twice the number of blocks. The fit works on
the scores as given (probabilities or logits); the interpolation, and so the
output between blocks, depends on that scale, the block values do not.
Ties are exact float equality (scikit-learn also merges scores closer than
1e-15, which only matters for such denormal-scale differences).

Prediction computes np.interp's own arithmetic, slope_j * (s - x_j) + y_j
with slope_j = (y_{j+1} - y_j) / (x_{j+1} - x_j), so it gives the same
floats; only the search for j differs. np.interp binary-searches each score
(about 45 ns a score for a few hundred thresholds on a 2-core server, half of
what /calibrate spends on 10,000 scores); large batches instead look j up in
a uniform grid over [x_1, x_k] (``_GridLookup``), a few vectorised passes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

try:  # SciPy's PAV kernel itself: isotonic_regression copies its inputs and checks them first
    from scipy.optimize._pava_pybind import pava as _pava
except ImportError:  # pragma: no cover - another SciPy layout
    _pava = None

from . import kernels
from ._fastpath import quick_list
from ..inputs import CalibrationInputError
from .base import Calibrator
from .validation import check_min_probability, keep_off_edges, state_array


def pool_ties(
    scores: np.ndarray, labels: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct scores ascending, with the total weight, positive weight and
    negative weight of the rows tied at each. Zero-weight rows are dropped."""
    if not weights.all():
        # A zero-weight row must not create a distinct score (scikit-learn drops them too).
        keep = weights > 0
        scores, labels, weights = scores[keep], labels[keep], weights[keep]
    if scores.shape[0] == 0:
        raise CalibrationInputError("sample_weight", "weights must not all be zero")
    if _unit_weights(labels, weights):
        pooled = _pool_unit_weights(scores, labels)
        if pooled is not None:
            return pooled
    # Stable, so that tied rows are summed in row order: a subset of rows sorted once
    # (``IsotonicCalibrator.cross_val_predictions``) pools to the very same floats.
    order = np.argsort(scores, kind="stable")
    return _pool_sorted(scores[order], labels[order], weights[order])


def _pool_sorted(
    sorted_scores: np.ndarray, labels: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``pool_ties`` of rows already in ascending score order, weights all > 0."""
    y = labels.astype(np.float64)
    starts = np.flatnonzero(np.concatenate(([True], sorted_scores[1:] != sorted_scores[:-1])))
    total = np.add.reduceat(w, starts)
    positive = np.add.reduceat(w * y, starts)
    negative = np.add.reduceat(w * (1.0 - y), starts)
    return sorted_scores[starts], total, positive, negative


def _thresholds(x: np.ndarray, total: np.ndarray, positive: np.ndarray, spare: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """PAV on pooled ties, trimmed to the block boundary points: (x_thresholds, y_thresholds).

    ``spare``: ``total`` and ``positive`` are the caller's to overwrite (no copies of millions of rows).
    """
    if spare:
        fitted, blocks = _pav(np.divide(positive, total, out=positive), total, spare=True)
    else:
        fitted, blocks = _pav(positive / total, total)
    # Keep the first and last point of every run of equal values: interior
    # points of a flat run add nothing to a linear interpolation. PAV's blocks
    # are such runs (it merges adjacent equal blocks); runs of blocks are taken
    # all the same, so that this holds whatever the kernel.
    starts = blocks[:-1]
    values = fitted[starts]
    rises = values[1:] != values[:-1]
    first = starts[np.concatenate(([True], rises))]
    last = blocks[1:][np.concatenate((rises, [True]))] - 1
    keep = np.union1d(first, last)
    # Block means of 0/1 labels lie in [0, 1]; the clip only undoes rounding.
    return x[keep], np.clip(fitted[keep], 0.0, 1.0)


def _pav(y: np.ndarray, w: np.ndarray, spare: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(the isotonic fit of ``y``, block boundaries b: block j is rows b_j .. b_{j+1} - 1).

    ``y`` (a new array) is overwritten; ``w`` is not, unless ``spare`` (a float64 array the
    caller gives up). The same floats as ``scipy.optimize.isotonic_regression``, which wraps
    the same kernel.
    """
    if _pava is None:
        result = isotonic_regression(y, weights=w)
        return result.x, result.blocks
    y = np.ascontiguousarray(y, dtype=np.float64)
    w = w if spare else np.array(w, dtype=np.float64)
    fitted, _, blocks, n_blocks = _pava(y, w, np.empty(y.shape[0] + 1, dtype=np.intp))
    return fitted, blocks[: n_blocks + 1]


def _unit_weights(labels: np.ndarray, weights: np.ndarray) -> bool:
    """Unit weights and 0/1 integer labels: the rows ``_unit_keys`` can carry."""
    return labels.dtype.kind in "iu" and (weights == 1.0).all() and labels.min() >= 0 and labels.max() <= 1


_NOT_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)


def _unit_keys(scores: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """One int64 per row whose integer order is score order, the 0/1 label in its last bit;
    None unless every |score| < 2 (probabilities always).

    Sorting these keys takes the place of an argsort and three gathers: a
    float's bits, mapped so that integer order is float order, shifted left by
    one, with the label in the freed bit (|score| < 2 leaves the bit free), so
    ties stay together and each tie's labels are its keys' last bits.
    """
    if not (scores.min() > -2.0 and scores.max() < 2.0):
        return None
    keys = (scores + 0.0).view(np.int64)  # + 0.0 turns -0.0, which ties with 0.0, into 0.0
    if scores.min() < 0.0:
        # Negative floats: flipping all but the sign bit makes their integer order their float order.
        keys = np.where(keys < 0, keys ^ _NOT_SIGN, keys)
    keys <<= 1
    keys |= labels
    return keys


def _pool_unit_weights(
    scores: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``pool_ties`` for unit weights and 0/1 labels with every |score| < 2 (probabilities), else None:
    one sort of ``_unit_keys``, about half the time of the general path at a million rows."""
    keys = _unit_keys(scores, labels)
    if keys is None:
        return None
    keys.sort()
    return _pool_keys(keys)


def _pool_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``pool_ties`` of sorted ``_unit_keys`` (overwritten)."""
    x, total, positive = _pool_keys_lazily(keys)
    return _key_scores(x), total, positive, total - positive


def _pool_keys_lazily(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_pool_keys`` less the negative weights, with the scores still keys (``_key_scores``
    turns them back): only the few kept as thresholds need turning back."""
    positive = np.bitwise_and(keys, 1, out=np.empty(keys.shape[0]), casting="unsafe")  # the labels, as 0.0/1.0
    keys >>= 1
    changes = keys[1:] != keys[:-1]
    if changes.all():  # no ties (the usual case at scale): nothing to sum
        return keys, np.ones(keys.shape[0]), positive
    starts = np.flatnonzero(np.concatenate(([True], changes)))
    total = np.diff(np.append(starts, keys.shape[0])).astype(np.float64)
    return keys[starts], total, np.add.reduceat(positive, starts)


def _fit_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_thresholds`` of sorted ``_unit_keys`` (overwritten)."""
    x, total, positive = _pool_keys_lazily(keys)
    x_thresholds, y = _thresholds(x, total, positive, spare=True)
    return _key_scores(x_thresholds), y


def _key_scores(keys: np.ndarray) -> np.ndarray:
    """The scores of keys shifted back (``_unit_keys`` undone, label dropped)."""
    return np.where(keys < 0, keys ^ _NOT_SIGN, keys).view(np.float64)


def interp_by_ratio(scores: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """np.interp as y0 + t (y1 - y0), t = (s - x0) / (x1 - x0) in [0, 1]: no overflow."""
    i = np.clip(np.searchsorted(x, scores, side="right") - 1, 0, x.shape[0] - 2)
    x0, x1, y0, y1 = x[i], x[i + 1], y[i], y[i + 1]
    t = np.clip((scores - x0) / (x1 - x0), 0.0, 1.0)
    return np.clip(y0 + t * (y1 - y0), y0, y1)


#: Below this many scores np.interp's binary search is cheaper than the grid's fixed cost.
_GRID_MIN_BATCH = 256
#: Fewer thresholds than this: np.interp's search is short enough.
_GRID_MIN_THRESHOLDS = 8
#: Grid cells per threshold tried (the finer one when the coarser has cells of more than
#: _PASSES thresholds), and the largest grid.
_CELLS_PER_THRESHOLD = (8, 32)
_MAX_CELLS = 1 << 18
#: Thresholds compared per score (isotonic thresholds come in pairs, a block's first and
#: last score, often closer than any cell); scores in cells holding more are binary-searched.
_PASSES = 2


def _slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each segment's slope (y_{j+1} - y_j) / (x_{j+1} - x_j), np.interp's, and 0 after the last
    threshold; infinite or NaN where knots are subnormal-close."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.append((y[1:] - y[:-1]) / (x[1:] - x[:-1]), 0.0)


def _grid_cells(x: np.ndarray, per_threshold: int) -> tuple[float, np.ndarray]:
    """The uniform grid over [x_1, x_k] (``_GridLookup``): its scale G / span, and the number of
    thresholds in each cell, cell(v) = floor((v - x_1) scale). The span must be finite and > 0."""
    scale = min(max(per_threshold * x.shape[0], 64), _MAX_CELLS) / float(x[-1] - x[0])
    cell = ((x - x[0]) * scale).astype(np.intp)
    return scale, np.bincount(cell, minlength=int(cell[-1]) + 1)


def _gridded(x: np.ndarray) -> bool:
    """Whether a grid can be laid over the thresholds: at least two, a finite span."""
    span = float(x[-1] - x[0]) if x.shape[0] > 1 else 0.0
    return bool(np.isfinite(span) and span > 0)


class _GridLookup:
    """np.interp(s, x, y) for many s at once, with the segment found through a uniform grid.

    The grid cuts [x_1, x_k] into G equal cells; cell(v) = floor((v - x_1) * G / span)
    is computed by the same float operations for thresholds and scores, and is
    monotone in v (rounding never reverses order), so every threshold in an
    earlier cell is <= s and every one in a later cell is > s. The segment of s,
    j = #{i: x_i <= s} - 1, is therefore base[cell] (the thresholds before the
    cell, minus one) plus one comparison with each threshold inside the cell:
    exact, whatever the rounding. ``following[t][c]`` is the (t+1)-th threshold
    from the cell's start (a later cell's threshold, or +inf, compares false).
    Each comparison is one vectorised pass over the batch, at most _PASSES;
    the few scores that fall in a cell holding more thresholds are
    binary-searched, and when many would (clustered thresholds) np.interp is
    kept. About 3.5 times faster than np.interp at 10,000 scores and a few
    hundred thresholds.
    """

    __slots__ = ("x", "y", "x_first", "x_last", "scale", "base", "following", "slopes", "crowded")

    @classmethod
    def build(cls, x: np.ndarray, y: np.ndarray, slopes: np.ndarray) -> _GridLookup | None:
        k = x.shape[0]
        if k < _GRID_MIN_THRESHOLDS:
            return None
        # Overflowing spans or slopes (subnormal-close knots) keep np.interp and its repair.
        if not (_gridded(x) and np.isfinite(slopes).all()):
            return None
        for per_threshold in _CELLS_PER_THRESHOLD:
            scale, counts = _grid_cells(x, per_threshold)
            if counts.max() <= _PASSES:
                break
        crowded = counts > _PASSES
        # Thresholds in crowded cells are few unless the scores cluster; then keep np.interp.
        if counts[crowded].sum() > k // 8:
            return None
        passes = int(min(counts.max(), _PASSES))
        self = cls()
        self.x, self.y, self.slopes = x, y, slopes
        self.x_first, self.x_last = float(x[0]), float(x[-1])
        self.scale = scale
        self.base = np.cumsum(counts) - counts - 1
        padded = np.append(x, np.full(passes, np.inf))
        self.following = [padded[self.base + step] for step in range(1, passes + 1)]
        self.crowded = crowded if crowded.any() else None
        return self

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        s = np.clip(scores, self.x_first, self.x_last)
        offset = s - self.x_first
        offset *= self.scale
        cell = offset.astype(np.intp)
        # take() rather than fancy indexing: the same gather with less setup.
        j = self.base.take(cell)
        for following in self.following:
            j += following.take(cell) <= s
        if self.crowded is not None:
            crowded = self.crowded.take(cell)
            if crowded.any():
                j[crowded] = np.searchsorted(self.x, s[crowded], side="right") - 1
        # np.interp's arithmetic: slope_j (s - x_j) + y_j; the last threshold has slope 0.
        p = s - self.x.take(j)
        p *= self.slopes.take(j)
        p += self.y.take(j)
        return p

    @property
    def nbytes(self) -> int:
        extra = 0 if self.crowded is None else self.crowded.nbytes
        return self.base.nbytes + sum(f.nbytes for f in self.following) + self.slopes.nbytes + extra


try:  # np.interp without its Python wrapper (dtype dispatch, period handling): a few us a call
    from numpy._core.multiarray import interp as _compiled_interp
except ImportError:  # pragma: no cover - another numpy layout
    _compiled_interp = None


class _Interpolator:
    """np.interp(s, x, y), "clip" outside [x_1, x_k], as fast as the batch allows.

    Large batches go through the grid; small ones straight to numpy's compiled
    interp. Only when some slope overflows (knots subnormal-close) can interp
    return non-finite values; then those rows are redone by ``interp_by_ratio``.
    """

    __slots__ = ("x", "y", "grid", "safe", "kernel", "nbytes")

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y
        slopes = _slopes(x, y)
        finite = bool(np.isfinite(slopes).all())
        #: The compiled lookup (kernels.py), where built: it serves every batch size, on the grid's
        #: cells (its search within a cell is exact however many thresholds the cell holds).
        self.kernel = None
        if kernels.available() and finite and _gridded(x):
            scale, counts = _grid_cells(x, _CELLS_PER_THRESHOLD[0])
            self.kernel = kernels.IsotonicLookup(x, y, slopes, scale, np.cumsum(counts) - counts - 1)
        self.grid = None if self.kernel is not None else _GridLookup.build(x, y, slopes)
        self.safe = finite and _compiled_interp is not None
        self.nbytes = sum(part.nbytes for part in (self.kernel, self.grid) if part is not None)

    def __call__(self, scores: np.ndarray | list[float]) -> np.ndarray:
        """The lookup of valid scores."""
        if self.kernel is not None:
            p = self.kernel(scores)
            if p is not None:
                return p
        if self.grid is not None and len(scores) >= _GRID_MIN_BATCH:
            return self.grid(np.asarray(scores, dtype=np.float64))
        x, y = self.x, self.y
        if self.safe:  # finite slopes: every output is finite (interp converts a list itself)
            return _compiled_interp(scores, x, y, None, None)
        scores = np.asarray(scores, dtype=np.float64)
        # np.interp holds the end values outside the fitted range (the "clip").
        p = np.interp(scores, x, y)
        # It divides by the knot spacing first, which overflows when two knots
        # are subnormal-close (scores within ~1e-300 of 0): redo those rows.
        bad = ~np.isfinite(p)
        if bad.any():
            p[bad] = interp_by_ratio(scores[bad], x, y)
        return p


class IsotonicCalibrator(Calibrator):
    """Isotonic regression: p'(s) = interp(s, x_thresholds_, y_thresholds_), the PAV fit's blocks.

    The non-decreasing fit m_1 <= ... <= m_k minimising sum_j W_j (ybar_j - m_j)^2 over the
    distinct holdout scores (pool-adjacent-violators), interpolated linearly between block
    boundaries and clipped outside them, as scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip")``.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    min_probability : float or None, default=None
        Outputs are kept within [m, 1 - m]: None is m = 1 / (2 (n + 1)) for n holdout rows;
        0 lets blocks of one class give exactly 0 or 1 (see ``keep_off_edges``).

    Attributes
    ----------
    x_thresholds_ : ndarray of shape (n_thresholds,)
        The block boundaries on the score axis, increasing.
    y_thresholds_ : ndarray of shape (n_thresholds,)
        The calibrated probability at each boundary, non-decreasing.

    References
    ----------
    B. Zadrozny and C. Elkan, "Transforming classifier scores into accurate multiclass
    probability estimates", KDD 2002. PAV: M. Ayer et al., "An empirical distribution
    function for sampling with incomplete information", Ann. Math. Statist., 1955.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.isotonic import IsotonicCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.01, 0.99, 500)
    >>> labels = rng.binomial(1, scores**2)  # the scores overstate P(y = 1) = s^2
    >>> calibrator = IsotonicCalibrator().fit(scores, labels)
    >>> calibrator.predict([0.2, 0.5, 0.8]).round(3)  # 0.001: the floor 1 / (2 (n + 1))
    array([0.001, 0.176, 0.79 ])
    """

    method = "isotonic"
    monotone = True
    fitted_attributes = ("x_thresholds_", "y_thresholds_")

    def __init__(self, input: str = "probability", min_probability: float | None = None):
        self.input = input
        self.min_probability = min_probability

    def _check_params(self) -> None:
        check_min_probability(self.min_probability)

    def _check_state(self) -> None:
        # Thresholds in order, outputs probabilities in order: what makes predict monotone.
        x = state_array(self.x_thresholds_, "x_thresholds_", within=(0.0, 1.0) if self.input == "probability" else None, non_decreasing=True)
        if not x.shape[0]:
            raise CalibrationInputError("state.x_thresholds_", "must not be empty")
        state_array(self.y_thresholds_, "y_thresholds_", shape=x.shape, within=(0.0, 1.0), non_decreasing=True)

    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        keys = _unit_keys(scores, labels) if _unit_weights(labels, weights) else None
        if keys is not None:
            keys.sort()
            self.x_thresholds_, y = _fit_keys(keys)
        else:
            x, total, positive, _ = pool_ties(scores, labels, weights)
            self.x_thresholds_, y = _thresholds(x, total, positive)
        # Kept off 0 and 1 (interpolation between the thresholds stays within them).
        self.y_thresholds_ = keep_off_edges(y, self.min_probability, np.count_nonzero(weights > 0))

    def cross_val_predictions(
        self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, folds: np.ndarray, n_splits: int
    ) -> np.ndarray:
        """Out-of-fold predictions (``crossfit``), the floats a clone refitted per fold gives, with one sort.

        The rows are sorted once (-0.0 read as 0.0); a fold's training rows,
        picked from them by a mask, are still in order, so each fold only pools its
        ties (``_pool_sorted``, the same sums in the same order as ``pool_ties``) and
        runs PAV. At 5 million rows this is several times cheaper than five sorts.
        """
        if _unit_weights(labels, weights):
            keys = _unit_keys(scores, labels)
            if keys is not None:
                return self._cross_val_unit(scores, keys, folds, n_splits)
        # Unit weights sum to whole numbers, exact in any order: the faster unstable sort will do.
        order = np.argsort(scores, kind=None if (weights == 1.0).all() else "stable")
        sorted_scores = scores[order] + 0.0
        sorted_weights = weights[order]
        sorted_positive = sorted_weights * labels[order]  # w * y, as _pool_sorted computes it
        sorted_folds = folds.astype(np.min_scalar_type(n_splits))[order]
        live = None if weights.all() else sorted_weights > 0  # zero-weight rows are predicted, never fitted
        # Distinct scores (the usual case at scale): every row is its own tie group, nothing to sum.
        distinct = bool((sorted_scores[1:] != sorted_scores[:-1]).all())
        out = np.empty(scores.shape[0], dtype=np.float64)
        for fold in range(n_splits):
            test = folds == fold
            if not test.any():
                continue
            train = sorted_folds != fold
            if live is not None:
                train &= live
            if not train.any():
                raise CalibrationInputError("sample_weight", "weights must not all be zero")
            x, total, positive = sorted_scores[train], sorted_weights[train], sorted_positive[train]
            if not distinct:
                starts = np.flatnonzero(np.concatenate(([True], x[1:] != x[:-1])))
                x, total, positive = x[starts], np.add.reduceat(total, starts), np.add.reduceat(positive, starts)
            model = type(self)(**self.get_params())
            model.x_thresholds_, y = _thresholds(x, total, positive)
            model.y_thresholds_ = keep_off_edges(y, self.min_probability, np.count_nonzero(train))
            out[test] = model._predict(scores[test])
        return out

    def _cross_val_unit(self, scores: np.ndarray, keys: np.ndarray, folds: np.ndarray, n_splits: int) -> np.ndarray:
        """``cross_val_predictions`` for unit weights and 0/1 labels (``_unit_keys``): each fold
        sorts its training rows' keys, one int64 each, and pools them as ``pool_ties`` does.

        The folds run on threads, as ``auto``'s candidates do (the sorts, gathers and
        lookups release the GIL); each writes only its own rows of the output.
        """
        from .auto import available_threads  # auto imports every method, this one too

        # The rows grouped by fold (row order within each, a counting sort): a fold's test rows
        # are then a slice and its training rows two, instead of masks over every row per fold.
        fold_of = folds.astype(np.min_scalar_type(n_splits))
        order = np.argsort(fold_of, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(fold_of, minlength=n_splits))))
        grouped_keys, grouped_scores = keys[order], scores[order]
        out = np.empty(scores.shape[0], dtype=np.float64)

        def predict_fold(fold: int) -> None:
            start, stop = bounds[fold], bounds[fold + 1]
            if start == stop:
                return
            train = np.concatenate((grouped_keys[:start], grouped_keys[stop:]))
            if not train.shape[0]:
                raise CalibrationInputError("sample_weight", "weights must not all be zero")
            train.sort()
            model = type(self)(**self.get_params())
            model.x_thresholds_, y = _fit_keys(train)
            del train
            model.y_thresholds_ = keep_off_edges(y, self.min_probability, scores.shape[0] - int(stop - start))
            out[order[start:stop]] = model._predict(grouped_scores[start:stop])

        threads = min(available_threads(), n_splits)
        if threads == 1:
            for fold in range(n_splits):
                predict_fold(fold)
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                list(pool.map(predict_fold, range(n_splits)))
        return out

    def predict_details(self, scores, **arrays):
        # The hot path: a short valid list goes to numpy's interp as it is (one numpy
        # call for the whole prediction); everything else through the full checks.
        if not arrays and getattr(self, "n_classes_", 2) == 2 and hasattr(self, "y_thresholds_"):
            probabilities = self.predict_compiled(scores)
            if probabilities is not None:
                return probabilities, {}
            if quick_list(scores, self.input):
                return self._interpolator()(scores), {}
        return super().predict_details(scores, **arrays)

    def predict_compiled(self, scores):
        if getattr(self, "n_classes_", 2) != 2 or not hasattr(self, "y_thresholds_"):
            return None
        kernel = self._interpolator().kernel
        return None if kernel is None else kernel(scores, kernels.score_bounds(self.input))

    def prepare(self) -> None:
        """Build the lookup grid now."""
        self._interpolator()

    def _interpolator(self) -> _Interpolator:
        x, y = self.x_thresholds_, self.y_thresholds_
        cached = getattr(self, "_lookup", None)
        if cached is None or cached.x is not x or cached.y is not y:
            cached = self._lookup = _Interpolator(x, y)
        return cached

    def _predict(self, scores: np.ndarray) -> np.ndarray:
        return self._interpolator()(scores)

    def fit_info(self) -> dict[str, Any]:
        x, y = self.x_thresholds_, self.y_thresholds_
        return {
            "n_blocks": int(1 + np.count_nonzero(y[1:] != y[:-1])),
            "n_thresholds": int(x.shape[0]),
            "score_range": [float(x[0]), float(x[-1])],
            "output_range": [float(y[0]), float(y[-1])],
        }
