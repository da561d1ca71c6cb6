"""Multicalibration: boosted trees on the score's logit and named features, round after round.

The approach of MCGrad (Tax, Perini, Linder, Haimovich, Okati, Guy &
Apostolopoulos 2026, "MCGrad: Multicalibration at Web Scale", KDD;
arXiv:2509.19884): a model is multicalibrated across the segments its
features define when no segment's calibration can be improved, and a
gradient-boosted tree whose splits are on those features and on the score
finds the segments where it can be, with the current logit as the offset
(init score) so that the trees learn the correction only:

    f_0(x) = a z + b                                    (z = logit of the score; a, b: Platt's fit, the global correction)
    f_r(x) = f_{r-1}(x) + T_r(f_{r-1}(x), features)      (T_r: a LightGBM ensemble fitted with offset f_{r-1})
    p      = sigmoid(f_R(x))

Each round's trees see the previous round's logit as a feature, so a later
round can split on where the earlier corrections moved a row (MCGrad's
rounds). Guards against fitting noise in small segments: a held-out split
(``validation_fraction``, stratified) early-stops the trees within a round
(``patience``) and stops the rounds when the held-out log loss stops falling;
leaves hold at least ``min_samples_leaf`` rows, categories are pooled below
that many (LightGBM's ``min_data_per_group``), and leaf values are shrunk by
an L2 penalty (``l2``). Differences from MCGrad, for speed at the same error:
a larger learning rate with early stopping inside each round (MCGrad fits a
fixed 94 trees at rate 0.029 per round, and on fewer than 2.5 million rows
picks its number of rounds by 5-fold cross-validation), and Platt's global
correction as the first offset.

LightGBM, not scikit-learn's HistGradientBoosting: boosting from an offset
(``init_score``) is what each round needs, and HistGradientBoosting has none.

The fitted model is plain JSON: per round, flat arrays of tree nodes
(feature, threshold, categories, children, default direction, missing-value
rule) and leaf values; ``predict`` walks them with numpy, every tree of a
round at once, and gives what LightGBM's own predict gives (to rounding).
A row with a category the fit never saw, or a request without ``features``,
gets the global correction f_0 alone.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from ._logistic import fit_logistic
from .base import ArraySpec, CalibrationInputError, Calibrator, sigmoid, to_logit
from .columns import Columns

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
#: Rows per block of the tree walk (block rows x trees of state).
PREDICT_BLOCK = 8192


def _log_loss(offset: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    return float(np.dot(w, np.logaddexp(0.0, offset) - y * offset) / w.sum())


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
    """Multicalibration by boosted trees on the logit and named features (see the module docstring).

    Options:
        max_rounds: at most this many rounds (each a tree ensemble on the previous round's logit).
        learning_rate, num_leaves, max_trees: each round's LightGBM ensemble; its trees stop
            early after ``patience`` trees without a better held-out log loss.
        min_samples_leaf: rows per leaf and per category group at least (null: n / 250,
            clipped to [20, 200]).
        l2: L2 penalty on leaf values.
        validation_fraction: the stratified held-out part for early stopping.
        seed: the held-out split's and LightGBM's seed.
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
        learning_rate: float = 0.3,
        num_leaves: int = 8,
        max_trees: int = 200,
        patience: int = 10,
        min_samples_leaf: int | None = None,
        l2: float = 10.0,
        validation_fraction: float = 0.2,
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
        self.validation_fraction = validation_fraction
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
        number("validation_fraction", 0.0, 0.5)
        integer("seed", 0, 2**31 - 1)

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
        import lightgbm as lgb  # only fitting needs it; predict walks the stored node arrays

        z = to_logit(scores, self.input)
        y = labels.astype(np.float64)
        a, b = (float(c) for c in fit_logistic(np.column_stack([z, np.ones_like(z)]), y, weights, init=[1.0, 0.0]))
        spec: list[dict] = []
        if features is not None:
            for name, kind in features.kinds().items():
                entry: dict[str, Any] = {"name": name, "kind": kind}
                if kind == "categorical":
                    entry["categories"] = sorted(set(features.columns[name].tolist()))
                spec.append(entry)
        X, _ = self._encode(features, spec) if features is not None else (np.empty((z.shape[0], 1)), None)
        offset = a * z + b
        n = z.shape[0]
        leaf = self.min_samples_leaf if self.min_samples_leaf is not None else int(np.clip(n // 250, 20, 200))
        validation = self._validation_rows(labels)
        train = ~validation
        categorical = [j for j, c in enumerate(spec, start=1) if c["kind"] == "categorical"]
        params = {
            "objective": "binary", "learning_rate": float(self.learning_rate), "num_leaves": int(self.num_leaves),
            "min_data_in_leaf": leaf, "min_data_per_group": leaf, "min_sum_hessian_in_leaf": 1e-3,
            "lambda_l2": float(self.l2), "cat_l2": float(self.l2), "cat_smooth": 10.0, "max_cat_to_onehot": 8,
            "max_bin": 255, "feature_pre_filter": False, "deterministic": True, "force_row_wise": True,
            "seed": int(self.seed), "verbosity": -1,
            # one thread: OpenMP threads spin-wait for each other, and on a busy machine (a service's
            # fit pool, other processes) two threads were ten times slower than one here
            "num_threads": 1,
        }
        rounds, history = [], []
        best = _log_loss(offset[validation], y[validation], weights[validation])
        history.append({"round": 0, "trees": 0, "validation_log_loss": best})
        for r in range(1, self.max_rounds + 1):
            X[:, 0] = offset
            train_set = lgb.Dataset(X[train], y[train], weight=weights[train], init_score=offset[train],
                                    categorical_feature=categorical, free_raw_data=False, params={"max_bin": 255, "verbosity": -1})
            valid_set = lgb.Dataset(X[validation], y[validation], weight=weights[validation], init_score=offset[validation],
                                    reference=train_set, categorical_feature=categorical)
            booster = lgb.train(params, train_set, num_boost_round=int(self.max_trees), valid_sets=[valid_set],
                                callbacks=[lgb.early_stopping(int(self.patience), verbose=False)])
            trees = booster.best_iteration or booster.current_iteration()
            forest_table = _flatten_trees(booster.dump_model(num_iteration=trees)["tree_info"])
            step = booster.predict(X, raw_score=True, num_iteration=trees)  # what _Forest.raw gives, in C++ (no init score)
            loss = _log_loss(offset[validation] + step[validation], y[validation], weights[validation])
            if not loss < best - 1e-7:  # this round does not help on the held-out rows: stop
                break
            offset = offset + step
            best = loss
            rounds.append(forest_table)
            history.append({"round": r, "trees": trees, "validation_log_loss": loss})
        self.model_ = {
            "global": {"a": a, "b": b},
            "features": spec,
            "rounds": rounds,
            "training": {"n_samples": n, "n_validation": int(validation.sum()), "min_samples_leaf": leaf, "history": history},
        }
        self._forests = None

    def _validation_rows(self, labels: np.ndarray) -> np.ndarray:
        """A stratified random held-out part (each class in proportion, at least one row of each)."""
        rng = np.random.default_rng(self.seed)
        held = np.zeros(labels.shape[0], dtype=bool)
        for value in (0, 1):
            rows = np.flatnonzero(labels == value)
            k = min(max(1, int(round(self.validation_fraction * rows.shape[0]))), rows.shape[0] - 1)
            held[rng.choice(rows, size=k, replace=False)] = True
        return held

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
        if not self._forests or (features is None and spec):
            return sigmoid(offset)
        X, unknown = self._encode(features, spec) if spec else (np.empty((z.shape[0], 1)), np.zeros(z.shape[0], bool))
        known = ~unknown
        rows = X[known]
        corrected = offset[known]
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

    def __getstate__(self) -> dict[str, Any]:  # clone() and copies carry the model, not the derived arrays
        state = dict(self.__dict__)
        state.pop("_forests", None)
        return state
