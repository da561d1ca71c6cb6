"""Multicalibration: boosted trees on the score's logit and named features, round after round.

The approach of MCGrad (Tax, Perini, Linder, Haimovich, Okati, Guy &
Apostolopoulos 2026, "MCGrad: Multicalibration at Web Scale", KDD;
arXiv:2509.19884): a model is multicalibrated across the segments its
features define when no segment's calibration can be improved, and a
gradient-boosted tree whose splits are on those features and on the score
finds the segments where it can be, with the current logit as the offset
(init score) so that the trees learn the correction only:

    g(x)   = a z + b                                      (z: the score's logit; Platt's fit, the global correction)
    f_0(x) = a' z + b' + sum_j beta_j[category_j(x)]      (the segment stage, penalised; else f_0 = g)
    f_r(x) = f_{r-1}(x) + T_r(f_{r-1}(x), features)       (T_r: LightGBM trees boosted from offset f_{r-1})
    p      = sigmoid(f_R(x))

Each round's trees see the previous round's logit as a feature, so a later
round can split on where the earlier corrections moved a row (MCGrad's
rounds). What the fit keeps is chosen on 5 stratified folds (nested early
stopping), not by constants: the start f_0 (the input as it is, or Platt's g),
each round's number of trees (every fold boosts from its own chain, the
rounds before fitted without its held-out rows, all folds a tree at a time,
until ``patience`` trees bring no lower pooled held-out log loss), the number
of rounds, and the segment stage. Each change is kept only when its paired
per-row gain in held-out log loss is at least EVIDENCE_Z standard errors above
zero, so an input with nothing to fix comes back as it was and the fit is never
worse than the input or Platt out of sample. Each kept round is then fitted on
every row with the number of trees found. Leaves hold at least
``min_samples_leaf`` rows, categories are pooled below that many (LightGBM's
``min_data_per_group``), and leaf values and category biases are shrunk by an
L2 penalty (``l2``). The folds' out-of-fold predictions (``out_of_fold_``) are
the cross-fitted summary's, so POST /calibrators fits once.

Where this departs from MCGrad: the segment stage f_0, a logistic regression
of the label on the logit and one bias per category with an L2 penalty
(Newton's method; ``_segment_offsets``), fits the additive per-segment biases
that trees would need many small steps for. Its biases can hide an
interaction from the trees' first split (each value's residual averages to
zero), so it starts the trees only when its boosted chain ends lower out of
sample than the chain from the input or Platt. The trees use a larger learning
rate with early stopping inside each round (MCGrad fits 94 trees at rate 0.029
per round and cross-validates its number of rounds).

LightGBM, not scikit-learn's HistGradientBoosting: boosting from an offset
(``init_score``) is what each round needs, and HistGradientBoosting has none.

The fitted model is plain JSON: g, f_0's coefficients per category, and per
round flat arrays of tree nodes (feature, threshold, categories, children,
default direction, missing-value rule) and leaf values; ``predict`` walks
them with numpy, every tree of a round at once, and gives what LightGBM's own
predict gives (to rounding). A row with a category the fit never saw, or a
request without ``features``, gets the global correction g alone.
"""

from __future__ import annotations

import itertools
import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from ._logistic import fit_logistic
from ._threads import single_threaded_blas
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import sigmoid, to_logit
from .validation import ArraySpec
from .columns import Columns
from .crossfit import OutOfFold, stratified_folds

FEATURES = ArraySpec(
    ndim=2,
    rows=True,
    required=False,
    columns=True,
    description='named columns, one value per row: strings (categorical) or numbers (numeric), {"country": [...], "age": [...]}',
)

#: LightGBM's missing-value rules of a numeric split (its MissingType).
MISSING_NONE, MISSING_ZERO, MISSING_NAN = 0, 1, 2
_MISSING = {"None": MISSING_NONE, "Zero": MISSING_ZERO, "NaN": MISSING_NAN}
#: LightGBM's kZeroThreshold: |x| at most this is zero for the Zero rule.
ZERO_THRESHOLD = 1e-35
#: Folds of the nested early stopping (the trees of a round, the rounds, the start).
N_FOLDS = 5
#: A change (the start, a round, the segment stage) is kept when its paired out-of-fold gain in log loss
#: is at least this many standard errors above zero.
EVIDENCE_Z = 1.0
#: LightGBM's Dataset construction (binning) on one thread too: OpenMP threads spin-wait for each other.
DATASET_PARAMS = {"max_bin": 255, "verbosity": -1, "num_threads": 1}
#: Rows per block of the tree walk (block rows x trees of state).
PREDICT_BLOCK = 8192


def _log_loss(offset: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    return float(np.dot(w, np.logaddexp(0.0, offset) - y * offset) / w.sum())


def _segment_offsets(
    z: np.ndarray, y: np.ndarray, w: np.ndarray, codes: list[np.ndarray], sizes: list[int], l2: float, init: tuple[float, float]
) -> tuple[float, float, list[np.ndarray]]:
    """a, b and one coefficient per category of each column, minimising

        sum_i w_i [log(1 + e^eta_i) - y_i eta_i] + (l2 / 2) sum_j sum_k beta_jk^2,
        eta_i = a z_i + b + sum_j beta_j[code_ij]

    by Newton's method with step halving. The Hessian's blocks are weighted
    counts: bincounts of each column's codes (with z and 1) and cross-tabulations
    of two columns' codes, so each iteration is a few passes however many
    categories there are. The penalty shrinks a category's coefficient by about
    l2 / (its rows x p (1 - p)): a large segment gets its own bias, a small one little of it.
    """
    d = 2 + sum(sizes)
    starts = np.cumsum([2, *sizes])[:-1]
    theta = np.zeros(d)
    theta[0], theta[1] = init
    penalty = np.r_[0.0, 0.0, np.full(d - 2, l2)]

    def eta_of(t: np.ndarray) -> np.ndarray:
        eta = t[0] * z + t[1]
        for start, code in zip(starts, codes):
            eta = eta + t[start:][code]
        return eta

    def objective(eta: np.ndarray, t: np.ndarray) -> float:
        return float(np.dot(w, np.logaddexp(0.0, eta) - y * eta)) + 0.5 * float(np.dot(penalty * t, t))

    eta = eta_of(theta)
    value = objective(eta, theta)
    for _ in range(50):
        p = sigmoid(eta)
        r = w * (p - y)
        h = w * p * (1.0 - p)
        grad = np.empty(d)
        grad[0], grad[1] = np.dot(r, z), r.sum()
        hess = np.zeros((d, d))
        hz = h * z
        hess[0, 0], hess[0, 1], hess[1, 1] = np.dot(hz, z), hz.sum(), h.sum()
        for start, code, size in zip(starts, codes, sizes):
            block = slice(start, start + size)
            grad[block] = np.bincount(code, weights=r, minlength=size)
            hess[0, block] = np.bincount(code, weights=hz, minlength=size)
            hess[1, block] = np.bincount(code, weights=h, minlength=size)
            hess[block, block] = np.diag(hess[1, block])
        for (s1, c1, n1), (s2, c2, n2) in itertools.combinations(list(zip(starts, codes, sizes)), 2):
            hess[s1:s1 + n1, s2:s2 + n2] = np.bincount(c1 * n2 + c2, weights=h, minlength=n1 * n2).reshape(n1, n2)
        hess = np.triu(hess) + np.triu(hess, 1).T
        grad += penalty * theta
        hess[np.diag_indices(d)] += penalty + 1e-9
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        for _halving in range(30):
            candidate = theta - step
            candidate_eta = eta_of(candidate)
            candidate_value = objective(candidate_eta, candidate)
            if candidate_value <= value:
                break
            step = step / 2
        else:
            break
        decrease = value - candidate_value
        theta, eta, value = candidate, candidate_eta, candidate_value
        if decrease <= 1e-10 * max(abs(value), 1.0):
            break
    betas = [theta[start:start + size].copy() for start, size in zip(starts, sizes)]
    return float(theta[0]), float(theta[1]), betas


def _flatten_trees(tree_info: list[dict]) -> dict[str, list]:
    """LightGBM's dump_model trees as one flat node table (JSON lists).

    Internal nodes are numbered across all trees; a child >= 0 is an internal
    node, a child < 0 is leaf ~child. ``roots`` holds each tree's root the same way.
    """
    table: dict[str, list] = {k: [] for k in ("feature", "threshold", "categories", "default_left", "missing",
                                              "left", "right", "leaf_value", "roots")}

    def walk(node: dict) -> int:
        if "split_index" not in node:
            table["leaf_value"].append(float(node["leaf_value"]))
            return ~(len(table["leaf_value"]) - 1)
        at = len(table["feature"])
        table["feature"].append(int(node["split_feature"]))
        if node["decision_type"] == "==":
            table["threshold"].append(None)
            table["categories"].append(sorted(int(c) for c in str(node["threshold"]).split("||")))
        else:
            table["threshold"].append(float(node["threshold"]))
            table["categories"].append(None)
        table["default_left"].append(bool(node["default_left"]))
        table["missing"].append(_MISSING[node["missing_type"]])
        table["left"].append(0)
        table["right"].append(0)
        table["left"][at] = walk(node["left_child"])
        table["right"][at] = walk(node["right_child"])
        return at

    for tree in tree_info:
        table["roots"].append(walk(tree["tree_structure"]))
    return table


class _Forest:
    """A round's node table as numpy arrays, walked for many rows and every tree at once."""

    def __init__(self, table: dict[str, list]):
        self.roots = np.asarray(table["roots"], dtype=np.int64)
        self.leaf_value = np.asarray(table["leaf_value"], dtype=np.float64)
        n = len(table["feature"])
        self.feature = np.asarray(table["feature"], dtype=np.int64).reshape(n)
        self.threshold = np.array([np.nan if t is None else t for t in table["threshold"]], dtype=np.float64).reshape(n)
        self.default_left = np.asarray(table["default_left"], dtype=bool).reshape(n)
        self.missing = np.asarray(table["missing"], dtype=np.int8).reshape(n)
        self.left = np.asarray(table["left"], dtype=np.int64).reshape(n)
        self.right = np.asarray(table["right"], dtype=np.int64).reshape(n)
        self.is_categorical = np.array([c is not None for c in table["categories"]], dtype=bool).reshape(n)
        width = 1 + max((max(c) for c in table["categories"] if c), default=0)
        # one row of membership flags per categorical node (row 0 for numeric nodes, unused)
        self.category_row = np.zeros(n, dtype=np.int64)
        rows = [c for c in table["categories"] if c is not None]
        self.members = np.zeros((len(rows) + 1, width), dtype=bool)
        for i, c in enumerate(rows, start=1):
            self.members[i, c] = True
        self.category_row[self.is_categorical] = np.arange(1, len(rows) + 1)
        self.width = width

    def raw(self, X: np.ndarray) -> np.ndarray:
        """Sum over trees of each row's leaf value (LightGBM's raw score without the init score)."""
        out = np.zeros(X.shape[0])
        if self.roots.shape[0] == 0:
            return out
        for start in range(0, X.shape[0], PREDICT_BLOCK):
            block = X[start:start + PREDICT_BLOCK]
            state = np.broadcast_to(self.roots, (block.shape[0], self.roots.shape[0])).copy()
            while True:
                active = state >= 0
                if not active.any():
                    break
                rows, trees = np.nonzero(active)
                node = state[rows, trees]
                x = block[rows, self.feature[node]]
                go_left = self._decide(x, node)
                state[rows, trees] = np.where(go_left, self.left[node], self.right[node])
            out[start:start + block.shape[0]] = self.leaf_value[~state].sum(axis=1)
        return out

    def _decide(self, x: np.ndarray, node: np.ndarray) -> np.ndarray:
        """LightGBM's NumericalDecision and CategoricalDecision."""
        nan = np.isnan(x)
        missing = self.missing[node]
        numeric_x = np.where(nan & (missing != MISSING_NAN), 0.0, x)  # NaN is 0 unless NaN is its own case
        use_default = ((missing == MISSING_ZERO) & (np.abs(numeric_x) <= ZERO_THRESHOLD)) | ((missing == MISSING_NAN) & nan)
        with np.errstate(invalid="ignore"):
            numeric = np.where(use_default, self.default_left[node], numeric_x <= self.threshold[node])
        categorical = self.is_categorical[node]
        if not categorical.any():
            return numeric
        code = np.where(nan, -1, x).astype(np.int64)
        valid = (code >= 0) & (code < self.width)
        member = self.members[self.category_row[node], np.where(valid, code, 0)] & valid
        return np.where(categorical, member, numeric)


class MulticalibrationCalibrator(Calibrator):
    """Multicalibration by boosted trees: p = sigmoid(f_R(x)), f_r = f_{r-1} + T_r(f_{r-1}, features).

    f_0 is the input's logit z, Platt's g(x) = a z + b or the segment stage; T_r is a LightGBM tree
    ensemble boosted from the offset f_{r-1}.

    What is kept (the start, each round's trees, the rounds, the segment stage) is chosen by nested
    early stopping on 5 stratified folds, each change only when its paired out-of-fold gain in log loss
    is at least ``EVIDENCE_Z`` standard errors above zero; the module docstring gives the details.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    max_rounds : int, default=4
        At most this many rounds, from 0 to 50 (each a tree ensemble on the previous round's logit).
    learning_rate : float, default=0.1
        Each round's boosting rate, in (0, 1].
    num_leaves : int, default=5
        Leaves per tree, from 2 to 256.
    max_trees : int, default=200
        Trees per round at most, from 1 to 5000.
    patience : int, default=10
        A round stops after this many trees without a lower pooled held-out log loss (1 to 1000).
    min_samples_leaf : int or None, default=None
        Rows per leaf and per category group at least; None: n / 20 clipped to [20, 200].
    l2 : float, default=10.0
        L2 penalty on leaf values and category biases, in [0, 1e6].
    segment_offsets : bool, default=True
        Consider the segment stage (a penalised logistic fit of the logit and a bias per category) as
        the trees' start; it is kept only when its chain ends lower out of sample.
    seed : int, default=0
        The folds' and LightGBM's seed, from 0 to 2**31 - 1.

    Attributes
    ----------
    model_ : dict
        The fitted model as plain JSON: g, the segment stage's coefficients per category, and per
        round the trees' nodes and leaf values.

    References
    ----------
    Ú. Hébert-Johnson, M. P. Kim, O. Reingold and G. N. Rothblum, "Multicalibration: calibration for
    the (computationally-identifiable) masses", ICML 2018.

    L. Tax, L. Perini, N. Linder, D. Haimovich, N. Okati, A. Guy and E. Apostolopoulos, "MCGrad:
    multicalibration at web scale", KDD 2026 (arXiv:2509.19884).

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.multicalibration import MulticalibrationCalibrator
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(0.05, 0.95, 4000)
    >>> country = rng.choice(["de", "fr", "us"], 4000)
    >>> logit = np.log(scores / (1 - scores)) + np.where(country == "us", 0.8, 0.0)  # "us" understated
    >>> labels = rng.binomial(1, 1 / (1 + np.exp(-logit)))
    >>> calibrator = MulticalibrationCalibrator().fit(scores, labels, features={"country": country.tolist()})
    >>> calibrator.predict([0.5, 0.5], features={"country": ["de", "us"]}).round(2)  # truth: 0.5, 0.69
    array([0.5 , 0.69])
    """

    method = "multicalibration"
    tasks = ("binary",)
    monotone = False
    min_samples = 20
    fit_arrays = {"features": FEATURES}
    predict_arrays = {"features": FEATURES}
    fitted_attributes = ("model_",)

    def __init__(
        self,
        input: str = "probability",
        max_rounds: int = 4,
        learning_rate: float = 0.1,
        num_leaves: int = 5,
        max_trees: int = 200,
        patience: int = 10,
        min_samples_leaf: int | None = None,
        l2: float = 10.0,
        segment_offsets: bool = True,
        seed: int = 0,
    ):
        self.input = input
        self.max_rounds = max_rounds
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.max_trees = max_trees
        self.patience = patience
        self.min_samples_leaf = min_samples_leaf
        self.l2 = l2
        self.segment_offsets = segment_offsets
        self.seed = seed

    def _check_params(self) -> None:
        def integer(name: str, low: int, high: int, nullable: bool = False) -> None:
            value = getattr(self, name)
            if nullable and value is None:
                return
            if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
                raise CalibrationInputError(f"options.{name}", f"must be an integer from {low} to {high}{' or null' if nullable else ''}")

        def number(name: str, low: float, high: float) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not low < value <= high:
                raise CalibrationInputError(f"options.{name}", f"must be a number in ({low:g}, {high:g}]")

        integer("max_rounds", 0, 50)
        number("learning_rate", 0.0, 1.0)
        integer("num_leaves", 2, 256)
        integer("max_trees", 1, 5000)
        integer("patience", 1, 1000)
        integer("min_samples_leaf", 1, 1_000_000, nullable=True)
        if isinstance(self.l2, bool) or not isinstance(self.l2, Real) or not 0 <= self.l2 <= 1e6:
            raise CalibrationInputError("options.l2", "must be a number in [0, 1e6]")
        integer("seed", 0, 2**31 - 1)
        for name in ("segment_offsets",):
            if not isinstance(getattr(self, name), bool):
                raise CalibrationInputError(f"options.{name}", "must be true or false")

    # -- features ----------------------------------------------------------------------------
    @staticmethod
    def _encode(features: Columns | None, spec: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """The feature matrix (column 0 left for the logit) and the rows with an unseen category."""
        n_columns = 1 + len(spec)
        n = 0 if features is None else len(features)
        X = np.empty((n, n_columns))
        unknown = np.zeros(n, dtype=bool)
        for j, column in enumerate(spec, start=1):
            values = features.columns[column["name"]]
            if column["kind"] == "numeric":
                X[:, j] = values
                continue
            lookup = {name: i for i, name in enumerate(column["categories"])}
            codes = np.fromiter((lookup.get(v, -1) for v in values.tolist()), dtype=np.int64, count=n)
            X[:, j] = codes
            unknown |= codes < 0
        return X, unknown

    def check_features(self, features: Columns) -> None:
        """Check named features against those this fitted calibrator was fitted on (names and kinds),
        as ``predict`` checks them; raises CalibrationInputError."""
        self._check_features(features, self.model_["features"])

    def _check_features(self, features: Columns | None, spec: list[dict]) -> None:
        if features is None:
            return
        kinds = features.kinds()
        expected = {c["name"]: c["kind"] for c in spec}
        for name, kind in kinds.items():
            if name not in expected:
                raise CalibrationInputError(f"features.{name}", f"not a feature of this calibrator (its features: {', '.join(expected) or 'none'})")
            if kind != expected[name]:
                raise CalibrationInputError(f"features.{name}", f"was {expected[name]} at fit time, not {kind}")
        missing = [name for name in expected if name not in kinds]
        if missing:
            raise CalibrationInputError(f"features.{missing[0]}", "required: this calibrator was fitted with it")

    # -- fitting -----------------------------------------------------------------------------
    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, features: Columns | None = None) -> None:
        # One BLAS thread, as in calibd's fit workers: the segment stage's small Newton solves
        # only wait for each other's threads (tens of ms a solve on a busy machine, not 0.2 ms).
        with single_threaded_blas():
            self._fit_rounds(scores, labels, weights, features)

    def _fit_rounds(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, features: Columns | None) -> None:
        import lightgbm as lgb  # only fitting needs it; predict walks the stored node arrays

        z = to_logit(scores, self.input)
        y = labels.astype(np.float64)
        n = z.shape[0]
        a, b = (float(c) for c in fit_logistic(np.column_stack([z, np.ones_like(z)]), y, weights, init=[1.0, 0.0]))
        spec: list[dict] = []
        if features is not None:
            for name, kind in features.kinds().items():
                entry: dict[str, Any] = {"name": name, "kind": kind}
                if kind == "categorical":
                    entry["categories"] = sorted(set(features.columns[name].tolist()))
                spec.append(entry)
        X, _ = self._encode(features, spec) if features is not None else (np.empty((n, 1)), None)
        categorical = [j for j, c in enumerate(spec, start=1) if c["kind"] == "categorical"]
        folds = stratified_folds(labels, N_FOLDS, self.seed)
        parts = [(np.flatnonzero(folds != k), np.flatnonzero(folds == k)) for k in range(N_FOLDS)]
        held_weight = [weights[held].sum() for _, held in parts]

        def out_of_fold_loss(chains: list[np.ndarray]) -> float:
            """The log loss of every row, each from the chain of the fold that held it out."""
            total = sum(_log_loss(chain[held], y[held], weights[held]) * w for chain, (_, held), w in zip(chains, parts, held_weight))
            return float(total / sum(held_weight))

        def row_losses(chains: list[np.ndarray]) -> np.ndarray:
            out = np.empty(n)
            for chain, (_, held) in zip(chains, parts):
                out[held] = np.logaddexp(0.0, chain[held]) - y[held] * chain[held]
            return out

        def better(new: list[np.ndarray], old: list[np.ndarray]) -> bool:
            """Whether ``new`` lowers the out-of-fold log loss by more than noise: the paired per-row
            gain's weighted mean at least EVIDENCE_Z standard errors above zero. A change the held-out
            rows cannot tell from noise (an already multicalibrated input, a segment of a few rows) is
            not made, so the fit does not get worse than the input or Platt out of sample."""
            gain = row_losses(old) - row_losses(new)
            total = weights.sum()
            mean = float(np.dot(weights, gain) / total)
            se = float(np.sqrt(np.dot(weights**2, (gain - mean) ** 2)) / total)
            return mean > 0 and mean >= EVIDENCE_Z * se

        if categorical and self.segment_offsets:
            codes = [X[:, j].astype(np.int64) for j in categorical]
            sizes = [len(spec[j - 1]["categories"]) for j in categorical]
            l2 = float(max(self.l2, 1e-6))

            def segment_stage(rows: np.ndarray) -> dict:
                la, lb, betas = _segment_offsets(z[rows], y[rows], weights[rows], [c[rows] for c in codes], sizes, l2, (a, b))
                return {"a": la, "b": lb, "coefficients": {spec[j - 1]["name"]: beta.tolist() for j, beta in zip(categorical, betas)}}

            stage_chains = [self._linear_offset(z, X, spec, segment_stage(fit_rows), a, b) for fit_rows, _ in parts]
        # Round 0, the start, chosen out of sample: the input as it is, or Platt's global correction
        # when its out-of-fold log loss is lower, so the fit never starts worse than either.
        start_losses = {"input": out_of_fold_loss([z] * N_FOLDS), "platt": out_of_fold_loss([a * z + b] * N_FOLDS)}
        if better([a * z + b] * N_FOLDS, [z] * N_FOLDS):
            start, linear, chains = "platt", {"a": a, "b": b, "coefficients": {}}, [a * z + b] * N_FOLDS
        else:
            start, linear, chains = "input", {"a": 1.0, "b": 0.0, "coefficients": {}}, [z] * N_FOLDS

        leaf = self.min_samples_leaf if self.min_samples_leaf is not None else int(np.clip(n // 20, 20, 200))
        params = {
            "objective": "binary", "metric": "binary_logloss", "learning_rate": float(self.learning_rate),
            "num_leaves": int(self.num_leaves), "min_data_in_leaf": leaf, "min_data_per_group": leaf,
            "min_sum_hessian_in_leaf": 1e-3, "lambda_l2": float(self.l2), "cat_l2": float(self.l2), "cat_smooth": 10.0,
            "max_cat_to_onehot": 8, "max_bin": 255, "feature_pre_filter": False, "deterministic": True,
            "force_row_wise": True, "seed": int(self.seed), "verbosity": -1,
            # one thread: OpenMP threads spin-wait for each other, and on a busy machine (a service's
            # fit pool, other processes) two threads were ten times slower than one here
            "num_threads": 1,
        }

        def dataset(rows: np.ndarray, chain: np.ndarray, reference=None):
            block = X[rows]
            block[:, 0] = chain[rows]
            return lgb.Dataset(block, y[rows], weight=weights[rows], init_score=chain[rows], categorical_feature=categorical,
                               reference=reference, free_raw_data=False, params=DATASET_PARAMS)

        def search(chains: list[np.ndarray]) -> tuple[list[np.ndarray], list[dict]]:
            """Rounds on the folds alone: each fold's trees boost from that fold's own chain (the rounds
            before, fitted without its held-out rows), all folds a tree at a time; a round's number of
            trees is where the pooled held-out log loss is lowest (``patience`` trees without a better
            one end it), and the rounds stop at the first that does not lower it."""
            chains = list(chains)
            best = out_of_fold_loss(chains)
            history = [{"round": 0, "trees": 0, "validation_log_loss": best}]
            for r in range(1, self.max_rounds + 1):
                boosters = []
                for (fit_rows, held), chain in zip(parts, chains):
                    train = dataset(fit_rows, chain)
                    booster = lgb.Booster(params, train)
                    booster.add_valid(dataset(held, chain, reference=train), "held")
                    boosters.append(booster)
                curve: list[float] = []
                for _tree in range(int(self.max_trees)):
                    total = 0.0
                    for booster, w in zip(boosters, held_weight):
                        booster.update()
                        total += booster.eval_valid()[0][2] * w
                    curve.append(total / sum(held_weight))
                    if len(curve) - 1 - int(np.argmin(curve)) >= self.patience:
                        break
                trees = int(np.argmin(curve)) + 1
                if not curve[trees - 1] < best - 1e-7:  # this round does not help out of sample: stop
                    break
                moved = []
                for booster, chain in zip(boosters, chains):
                    block = X.copy()
                    block[:, 0] = chain
                    moved.append(chain + booster.predict(block, num_iteration=trees, raw_score=True, num_threads=1))
                if not better(moved, chains):  # it helps, but not by more than noise: stop
                    break
                chains = moved
                best = curve[trees - 1]
                history.append({"round": r, "trees": trees, "validation_log_loss": best})
            return chains, history

        chains, history = search(chains)
        if categorical and self.segment_offsets and out_of_fold_loss(stage_chains) < history[0]["validation_log_loss"] - 1e-7:
            # the segment stage (when it beats the start out of sample) as the start instead, kept only
            # if its rounds end lower out of sample (its biases can hide an interaction from the trees'
            # first split, so it must earn its place)
            stage_chains, stage_history = search(stage_chains)
            if better(stage_chains, chains):
                start, linear, chains, history = "segment stage", segment_stage(np.arange(n)), stage_chains, stage_history
        history[0]["start"] = start
        # the rounds found, fitted on every row
        offset = self._linear_offset(z, X, spec, linear, a, b)
        rounds = []
        for entry in history[1:]:
            X[:, 0] = offset
            full = lgb.Dataset(X, y, weight=weights, init_score=offset, categorical_feature=categorical,
                               free_raw_data=False, params=DATASET_PARAMS)
            booster = lgb.train(params, full, num_boost_round=entry["trees"])
            rounds.append(_flatten_trees(booster.dump_model()["tree_info"]))
            offset = offset + booster.predict(X, raw_score=True, num_threads=1)  # what _Forest.raw gives, in C++ (no init score)
        out_of_fold = np.empty(n)
        for chain, (_, held) in zip(chains, parts):
            out_of_fold[held] = sigmoid(chain[held])
        # the summary's cross-fit reuses these (same folds as fit_calibrator's when seed is 0)
        self.out_of_fold_ = OutOfFold(folds.astype(np.int64), out_of_fold)
        self.model_ = {
            "global": {"a": a, "b": b},
            "features": spec,
            "linear": linear,
            "rounds": rounds,
            "training": {"n_samples": n, "validation": f"{N_FOLDS}-fold", "min_samples_leaf": leaf, "start": start,
                         "start_log_loss": start_losses, "history": history},
        }
        self._forests = None

    @staticmethod
    def _linear_offset(z: np.ndarray, X: np.ndarray, spec: list[dict], linear: dict | None, a: float, b: float) -> np.ndarray:
        """The first offset: the start's a' z + b' + sum_j beta_j[category] (rows of known
        categories; the input: a' = 1, b' = 0), else Platt's a z + b."""
        if linear is None:
            return a * z + b
        eta = linear["a"] * z + linear["b"]
        for j, column in enumerate(spec, start=1):
            if column["name"] in linear["coefficients"]:
                beta = np.asarray(linear["coefficients"][column["name"]], dtype=np.float64)
                eta = eta + beta[X[:, j].astype(np.int64)]
        return eta

    # -- prediction --------------------------------------------------------------------------
    def prepare(self) -> None:
        self._forests = [_Forest(table) for table in self.model_["rounds"]]

    def _predict(self, scores: np.ndarray, features: Columns | None = None) -> np.ndarray:
        if getattr(self, "_forests", None) is None:
            self.prepare()
        spec = self.model_["features"]
        self._check_features(features, spec)
        z = to_logit(scores, self.input)
        offset = self.model_["global"]["a"] * z + self.model_["global"]["b"]
        if features is None and spec:
            return sigmoid(offset)
        X, unknown = self._encode(features, spec) if spec else (np.empty((z.shape[0], 1)), np.zeros(z.shape[0], bool))
        known = ~unknown
        rows = X[known]
        g = self.model_["global"]
        corrected = self._linear_offset(z[known], rows, spec, self.model_.get("linear"), g["a"], g["b"])
        for forest in self._forests:
            rows[:, 0] = corrected
            corrected = corrected + forest.raw(rows)
        offset[known] = corrected
        return sigmoid(offset)

    def fit_info(self) -> dict[str, Any]:
        model = self.model_
        return {
            "global": dict(model["global"]),
            "features": [{"name": c["name"], "kind": c["kind"], **({"categories": len(c["categories"])} if "categories" in c else {})}
                         for c in model["features"]],
            "rounds": len(model["rounds"]),
            "trees": [len(r["roots"]) for r in model["rounds"]],
            "training": model["training"],
        }

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> Calibrator:
        # stored before the nested early stopping: validation_fraction no longer exists (the model predicts as it did)
        return super()._from_state({k: v for k, v in params.items() if k != "validation_fraction"}, state)

    def __getstate__(self) -> dict[str, Any]:  # clone() and copies carry the model, not the derived arrays
        state = dict(self.__dict__)
        state.pop("_forests", None)
        return state
