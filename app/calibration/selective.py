"""Selective recalibration: learn which inputs to set aside so that a simple recalibrator fits the rest.

Zollo, Deng, Snell, Pitassi & Zemel, "Improving predictor reliability with selective
recalibration" (TMLR 2024; papers/004). A recalibrator h (Platt scaling for binary scores,
temperature scaling for multiclass rows) and a selector g_hat(x) = sigmoid(s(x)), a small ReLU
MLP on a feature embedding x of each input (``features``), minimise (eqs. 5, 6, 9, 10)

    L = S-TLBCE / mean(g_hat) + lambda * (beta - mean(g_hat))^2,
    S-TLBCE = -(1/n) sum_i g_hat_i [c_i log h_i + (1 - c_i) log(1 - h_i)],

with h_i the recalibrated top-label confidence, c_i = 1[y_i = predicted class], beta the target
coverage and lambda the coverage penalty. An input is accepted when g_hat >= tau, tau set on a
held-out share of the holdout so that coverage on fresh data lies in beta_hat +- sqrt(log(2/delta)
/ (2 n_tau)) with probability >= 1 - delta. Options: see ``SelectiveCalibrator``. The training
modes, the guard, the scores-only mode and the figures behind the defaults: docs/methods/selective.md.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

import numpy as np

from ..metrics import brier, ece
from . import _mlp
from ._threads import single_threaded_blas
from ._multiclass import MAX_TEMPERATURE, MIN_TEMPERATURE, as_logits
from ..inputs import CalibrationInputError
from .base import Calibrator
from .scales import sigmoid, to_logit
from .validation import ArraySpec
from .crossfit import CROSS_FIT_SEED, CROSS_FIT_SPLITS, stratified_folds
from .platt import PlattCalibrator
from .temperature import TemperatureCalibrator

MODES = ("sequential", "refit", "joint")
FEATURES = ArraySpec(ndim=2, rows=True, required=False, description="a feature embedding per row (n x f)")
FEATURES_REQUIRED = ArraySpec(
    ndim=2, rows=True, required=True, description="a feature embedding per row, as at fit time (n x f)"
)


# -- the recalibrator's per-row top-label log-loss and its gradient ------------------------


class RecalibrationData:
    """What the recalibrator's loss needs from validated scores and labels.

    Binary: z the class-1 logit, target the class-1 label; parameters (A, B),
    h = sigmoid(A z + B). Multiclass: the logits and the correctness c of the
    predicted class (the argmax, which a temperature does not change);
    parameter log T, h = softmax(z / T)[argmax].
    """

    def __init__(self, scores: np.ndarray, labels: np.ndarray, input: str):
        self.multiclass = scores.ndim == 2
        if self.multiclass:
            self.z = as_logits(scores, input)
            rows = np.arange(self.z.shape[0])
            self.top = self.z.argmax(axis=1)
            self.target = (labels == self.top).astype(np.float64)
            self.z_top = self.z[rows, self.top]
            self.others = self.z.copy()
            self.others[rows, self.top] = -np.inf
        else:
            self.z = to_logit(scores, input)
            self.target = labels.astype(np.float64)

    def subset(self, rows: np.ndarray) -> RecalibrationData:
        part = object.__new__(RecalibrationData)
        part.multiclass = self.multiclass
        for name in ("z", "target", "top", "z_top", "others"):
            if hasattr(self, name):
                setattr(part, name, getattr(self, name)[rows])
        return part


def recalibration_losses(params: np.ndarray, data: RecalibrationData) -> tuple[np.ndarray, np.ndarray]:
    """Per-row top-label cross-entropy of h and its gradient, shape (n, n_params).

    Binary, eta = A z + B: l = log(1 + e^eta) - y eta, dl/deta = sigmoid(eta) - y.
    Multiclass, b = 1/T = exp(-log T), p = softmax(b z), h = p_k (k the argmax):
    log h = b z_k - lse(b z), log(1 - h) = lse_{j != k}(b z_j) - lse(b z),
    dl/db = -(c - (1 - c) h / (1 - h)) (z_k - E_p[z]), dl/dlogT = -b dl/db.
    """
    if not data.multiclass:
        a, b = params
        eta = a * data.z + b
        losses = np.logaddexp(0.0, eta) - data.target * eta
        residual = sigmoid(eta) - data.target
        return losses, np.column_stack([residual * data.z, residual])
    inverse_t = math.exp(-float(params[0]))
    u = inverse_t * data.z
    u_max = u.max(axis=1, keepdims=True)
    e = np.exp(u - u_max)
    total = e.sum(axis=1)
    log_total = np.log(total) + u_max[:, 0]
    log_h = inverse_t * data.z_top - log_total
    with np.errstate(divide="ignore"):
        log_rest = _logsumexp_rows(inverse_t * data.others) - log_total
    c = data.target
    losses = -(c * log_h + (1.0 - c) * np.where(c < 1.0, log_rest, 0.0))
    mean_z = (e * data.z).sum(axis=1) / total
    odds = np.exp(np.minimum(log_h - log_rest, 700.0))  # h / (1 - h)
    d_inverse_t = -(c - (1.0 - c) * odds) * (data.z_top - mean_z)
    return losses, (-inverse_t * d_inverse_t)[:, None]


def _logsumexp_rows(u: np.ndarray) -> np.ndarray:
    top = u.max(axis=1, keepdims=True)
    finite_top = np.where(np.isfinite(top), top, 0.0)
    return np.log(np.exp(u - finite_top).sum(axis=1)) + finite_top[:, 0]


def selective_loss(
    s: np.ndarray, losses: np.ndarray, weights: np.ndarray, beta: float, penalty: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """The surrogate L, dL/ds (s the selector's pre-sigmoid output) and the row weights dL/dl.

    With omega = w / sum(w), g = sigmoid(s), G = sum omega g, S = sum omega g l:
    L = S / G + penalty (beta - G)^2,
    dL/dg_i = omega_i [(l_i - S/G) / G - 2 penalty (beta - G)],  dL/ds = dL/dg g (1 - g),
    dL/dl_i = omega_i g_i / G (how h's parameters enter, through l).
    """
    omega = weights / weights.sum()
    g = sigmoid(s)
    coverage = max(float(np.dot(omega, g)), 1e-300)
    selected = omega * g
    mean_loss = float(np.dot(selected, losses)) / coverage
    value = mean_loss + penalty * (beta - coverage) ** 2
    d_g = omega * ((losses - mean_loss) / coverage - 2.0 * penalty * (beta - coverage))
    return value, d_g * g * (1.0 - g), selected / coverage


# -- the calibrator ---------------------------------------------------------------------


class SelectiveCalibrator(Calibrator):
    """Selective recalibration: h recalibrates the inputs with g_hat(x) >= tau, g_hat a selector MLP.

    h is Platt scaling (binary) or temperature scaling (multiclass, on the top-label
    confidence); g_hat = sigmoid(MLP(x)) on a feature embedding x (``features``; without them,
    on the scores). They minimise S-TLBCE / mean(g_hat) + lambda (beta - mean(g_hat))^2, and tau
    is set on held-out rows so that the share accepted is beta (with a Hoeffding interval).
    ``predict_details`` returns, beside h's probabilities, ``accepted`` per row.

    Parameters
    ----------
    input : {"probability", "logit"}, default="probability"
        The scale the scores come on.
    beta : float, default=0.8
        Target coverage, the share of inputs accepted, in (0, 1].
    mode : {"joint", "refit", "sequential"}, default="joint"
        ``joint``: h trained with the selector; ``refit``: the selector trained with h fixed,
        then h refitted on the accepted rows; ``sequential``: h fixed throughout.
    hidden : list of int, default=(64, 64)
        Widths of the selector's hidden ReLU layers ([] is a logistic-regression selector).
    epochs : int, default=100
        Passes over the selector-training rows.
    batch_size : int, default=128
        Rows per Adam step.
    learning_rate : float, default=0.001
        Adam's step size.
    coverage_penalty : float, default=32.0
        lambda, the weight of (beta - mean g)^2, as in the paper.
    threshold_fraction : float, default=0.25
        Share of the holdout held out of training to set tau.
    confidence : float, default=0.95
        Level of the coverage interval, 1 - delta.
    seed : int, default=0
        Seeds the split, the initial weights and the batch order.
    guard : bool, default=True
        Fall back to recalibration alone when the cross-fitted summary finds the accepted rows
        far worse calibrated than recalibration alone.

    Attributes
    ----------
    recalibrator_ : Calibrator
        h: a fitted ``PlattCalibrator`` (binary) or ``TemperatureCalibrator`` (multiclass).
    selector_ : dict or None
        The selector MLP's weights (None when beta is 1: every input accepted).
    threshold_, threshold_logit_ : float
        tau, and tau on the MLP's output before the sigmoid.
    coverage_ : dict
        The coverage estimate on the threshold rows and its Hoeffding interval.
    training_ : dict
        How the selector was trained: the feature count (None: on the scores), the rows used
        for training and for tau, the final loss.
    score_ndim_ : int
        1 for binary scores, 2 for rows: ``predict`` takes the same.

    References
    ----------
    T. Zollo, Z. Deng, J. Snell, T. Pitassi and R. Zemel, "Improving predictor reliability with
    selective recalibration", TMLR 2024 (papers/004). The modes, the guard and the choice of
    the defaults: docs/methods/selective.md.

    Examples
    --------
    >>> import numpy as np
    >>> from calibd.calibration.selective import SelectiveCalibrator
    >>> rng = np.random.default_rng(0)
    >>> outlier = rng.random(1000) < 0.2  # a fifth of the inputs, where the score misleads
    >>> features = np.column_stack([outlier + 0.1 * rng.normal(size=1000), rng.normal(size=1000)])
    >>> z = rng.normal(scale=2, size=1000)
    >>> labels = rng.binomial(1, 1 / (1 + np.exp(-np.where(outlier, -z, z) / 2)))
    >>> calibrator = SelectiveCalibrator(beta=0.8, hidden=[8], epochs=10)
    >>> calibrator = calibrator.fit(1 / (1 + np.exp(-z)), labels, features=features)
    >>> probabilities, extras = calibrator.predict_details(
    ...     [0.12, 0.88, 0.88], features=[[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    >>> probabilities.round(3)  # the inliers' truth: 0.269, 0.731
    array([0.313, 0.712, 0.712])
    >>> extras["accepted"]  # the last row has an outlier's features
    array([ True,  True, False])
    """

    method = "selective"
    tasks = ("binary", "multiclass")
    monotone = False
    min_samples = 20
    fit_arrays = {"features": FEATURES}
    fitted_attributes = ("recalibrator_", "selector_", "threshold_", "threshold_logit_", "coverage_", "training_", "score_ndim_")

    def __init__(
        self,
        input: str = "probability",
        beta: float = 0.8,
        mode: str = "joint",
        hidden: list[int] | tuple[int, ...] = (64, 64),
        epochs: int = 100,
        batch_size: int = 128,
        learning_rate: float = 1e-3,
        coverage_penalty: float = 32.0,
        threshold_fraction: float = 0.25,
        confidence: float = 0.95,
        seed: int = 0,
        guard: bool = True,
    ):
        self.input = input
        self.beta = beta
        self.mode = mode
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.coverage_penalty = coverage_penalty
        self.threshold_fraction = threshold_fraction
        self.confidence = confidence
        self.seed = seed
        self.guard = guard

    # -- options --------------------------------------------------------------------------
    def _check_params(self) -> None:
        def number(name: str, low: float, high: float, low_open: bool, high_open: bool) -> None:
            value = getattr(self, name)
            ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
            if not ok:
                interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
                raise CalibrationInputError(f"options.{name}", f"must be a number in {interval}")

        def integer(name: str, low: int, high: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or not low <= value <= high:
                raise CalibrationInputError(f"options.{name}", f"must be an integer from {low} to {high}")

        number("beta", 0.0, 1.0, True, False)
        if self.mode not in MODES:
            raise CalibrationInputError("options.mode", f"must be one of {', '.join(MODES)}")
        hidden = self.hidden
        if (
            not isinstance(hidden, (list, tuple))
            or len(hidden) > 4
            or any(isinstance(w, bool) or not isinstance(w, Integral) or not 1 <= w <= 1024 for w in hidden)
        ):
            raise CalibrationInputError("options.hidden", "must be a list of at most 4 layer widths, integers from 1 to 1024")
        integer("epochs", 1, 100_000)
        integer("batch_size", 2, 1_000_000)
        number("learning_rate", 0.0, 1.0, True, False)
        number("coverage_penalty", 0.0, 1e6, False, False)
        number("threshold_fraction", 0.0, 0.9, True, False)
        number("confidence", 0.0, 1.0, True, True)
        integer("seed", 0, 2**32 - 1)
        if not isinstance(self.guard, bool):
            raise CalibrationInputError("options.guard", "must be true or false")

    # -- declared arrays ------------------------------------------------------------------
    @property
    def predict_arrays(self) -> dict[str, ArraySpec]:  # type: ignore[override]
        """``features`` is required by a calibrator fitted with features; optional for the
        unfitted prototype (cross-fitting) and for one fitted on scores alone (which refuses them)."""
        training = getattr(self, "training_", None)
        if training is not None and training.get("n_features") is not None:
            return {"features": FEATURES_REQUIRED}
        return {"features": FEATURES}

    # -- fitting --------------------------------------------------------------------------
    def _fit(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, features: np.ndarray | None = None) -> None:
        self.guard_ = None  # set by the cross-fitted summary (fit_calibrator)
        with single_threaded_blas():
            self._fit_selective(scores, labels, weights, features)

    def _fit_selective(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, features: np.ndarray | None) -> None:
        rng = np.random.default_rng(self.seed)
        self.score_ndim_ = scores.ndim
        n_features = None if features is None else int(features.shape[1])
        inputs = features if features is not None else score_feature(scores, self.input)
        if self.beta >= 1.0:
            self.recalibrator_ = _fit_recalibrator(scores, labels, weights, self.input)
            self.selector_ = None
            self.threshold_, self.threshold_logit_ = 0.0, None
            self.coverage_ = {"target": 1.0, "reached": 1.0, "interval": [1.0, 1.0], "confidence": self.confidence, "n_rows": 0}
            self.training_ = {"n_features": n_features, "n_selector_rows": int(scores.shape[0]), "n_threshold_rows": 0}
            return

        data = RecalibrationData(scores, labels, self.input)
        held = stratified_holdout(labels, self.threshold_fraction, rng)
        train = np.flatnonzero(~held)
        mean = inputs[train].mean(axis=0)
        scale = inputs[train].std(axis=0)
        scale[~(scale > 1e-12)] = 1.0
        x = (inputs - mean) / scale

        recalibrator = _fit_recalibrator(scores[train], labels[train], weights[train], self.input)
        params = _parameters(recalibrator)
        selector, h_params, history = self._train_selector(x[train], data.subset(train), weights[train], params, rng)

        s_held = _mlp.predict(selector, x[held])
        threshold_logit = coverage_threshold(s_held, self.beta)
        if self.mode != "sequential":
            # The service selects hard (g_hat >= tau): the last h step minimises the loss for
            # that selection, over every holdout row it accepts. The selector is final by now,
            # so h may use the threshold rows too without touching the coverage guarantee.
            kept = _mlp.predict(selector, x) >= threshold_logit
            if np.any(weights[kept] > 0):
                h_params = minimise_recalibration(h_params, data, weights * kept)
            recalibrator = _with_parameters(recalibrator, h_params)
        reached = float(np.mean(s_held >= threshold_logit))
        n_held = int(s_held.shape[0])
        half_width = hoeffding_half_width(n_held, 1.0 - self.confidence)

        self.recalibrator_ = recalibrator
        self.selector_ = {
            "input": "features" if features is not None else "scores",
            "n_inputs": int(inputs.shape[1]),
            "mean": mean,
            "scale": scale,
            "layers": selector,
        }
        self.threshold_logit_ = float(threshold_logit)
        self.threshold_ = float(sigmoid(np.array(threshold_logit)))
        self.coverage_ = {
            "target": float(self.beta),
            "reached": reached,
            "interval": [max(0.0, reached - half_width), min(1.0, reached + half_width)],
            "confidence": float(self.confidence),
            "n_rows": n_held,
        }
        self.training_ = {
            "n_features": n_features,
            "n_selector_rows": int(train.shape[0]),
            "n_threshold_rows": n_held,
            **history,
        }

    def _train_selector(
        self, x: np.ndarray, data: RecalibrationData, weights: np.ndarray, h_params: np.ndarray, rng: np.random.Generator
    ) -> tuple[list[np.ndarray], np.ndarray, dict[str, Any]]:
        """Adam on the selector's weights (h fixed, or refitted each epoch in joint mode)."""
        n = x.shape[0]
        start_bias = math.log(self.beta / (1.0 - self.beta)) if self.beta < 1.0 else 0.0
        params = _mlp.init_mlp(x.shape[1], [int(w) for w in self.hidden], rng, output_bias=float(np.clip(start_bias, -4.0, 4.0)))
        optimizer = _mlp.Adam(params, self.learning_rate)
        losses, _ = recalibration_losses(h_params, data)
        n_batches = max(1, round(n / int(self.batch_size)))
        for _ in range(int(self.epochs)):
            # Batches of (nearly) equal size: the loss is a ratio of batch means, which a
            # small leftover batch would estimate poorly.
            for rows in np.array_split(rng.permutation(n), n_batches):
                w = weights[rows]
                if not w.sum() > 0:
                    continue
                s, activations = _mlp.forward(params, x[rows])
                _, d_s, _ = selective_loss(s, losses[rows], w, self.beta, self.coverage_penalty)
                optimizer.step(params, _mlp.backward(params, activations, d_s))
            if self.mode == "joint":
                g = sigmoid(_mlp.predict(params, x))
                h_params = minimise_recalibration(h_params, data, weights * g)
                losses, _ = recalibration_losses(h_params, data)
        s = _mlp.predict(params, x)
        value, _, _ = selective_loss(s, losses, weights, self.beta, self.coverage_penalty)
        g = sigmoid(s)
        history = {"final_loss": float(value), "mean_selector_output": float(np.average(g, weights=weights))}
        return params, h_params, history

    # -- prediction -----------------------------------------------------------------------
    def check_predict_scores(self, scores: Any) -> np.ndarray:
        checked = super().check_predict_scores(scores)
        if checked.ndim != self.score_ndim_:
            shape = "a flat list of scores" if self.score_ndim_ == 1 else f"rows of {self.n_classes_} scores"
            raise CalibrationInputError("scores", f"this calibrator was fitted on {shape}")
        if checked.ndim == 2 and checked.shape[1] != self.n_classes_:
            raise CalibrationInputError(
                "scores", f"rows have {checked.shape[1]} columns but this calibrator was fitted on {self.n_classes_}", (0,)
            )
        return checked

    def _predict(self, scores: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        return self._predict_details(scores, features=features)[0]

    def _predict_details(self, scores: np.ndarray, features: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        probabilities = self.recalibrator_._predict(scores)
        return probabilities, {"accepted": self.accept(scores, features)}

    def selector_output(self, scores: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """g_hat in [0, 1] for validated scores (and features); all ones when beta = 1."""
        return sigmoid(self._selector_logits(scores, features))

    def accept(self, scores: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """The acceptance flags g_hat >= tau, for validated scores (and features)."""
        if self.selector_ is None:
            self._check_features(features)
            return np.ones(scores.shape[0], dtype=bool)
        return self._selector_logits(scores, features) >= self.threshold_logit_

    def _check_features(self, features: np.ndarray | None) -> None:
        expected = self.training_.get("n_features")
        if expected is None:
            if features is not None:
                raise CalibrationInputError(
                    "features", "this calibrator was fitted without features (it selects on the scores alone); send none"
                )
            return
        if features is None:
            raise CalibrationInputError("features", "required by this calibrator: a feature embedding per row")
        if features.shape[1] != expected:
            raise CalibrationInputError(
                "features", f"rows have {features.shape[1]} columns but this calibrator was fitted on {expected}", (0,)
            )

    def _selector_logits(self, scores: np.ndarray, features: np.ndarray | None) -> np.ndarray:
        self._check_features(features)
        if self.selector_ is None:
            return np.full(scores.shape[0], np.inf)
        inputs = features if self.selector_["input"] == "features" else score_feature(scores, self.input)
        x = (inputs - self.selector_["mean"]) / self.selector_["scale"]
        return _mlp.predict(self.selector_["layers"], x)

    # -- summaries ------------------------------------------------------------------------
    def fit_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "mode": self.mode,
            "beta": float(self.beta),
            "selector_input": "scores" if self.training_.get("n_features") is None else "features",
            "recalibrator": _parameters_info(self.recalibrator_),
            "threshold": self.threshold_,
            "coverage": dict(self.coverage_),
            "training": dict(self.training_),
        }
        if getattr(self, "guard_", None) is not None:
            info["guard"] = dict(self.guard_)
        if self.selector_ is not None:
            info["selector"] = {"n_inputs": self.selector_["n_inputs"], "hidden": [int(w) for w in self.hidden]}
        return info

    def cross_fit_summary(
        self,
        out_of_fold: np.ndarray,
        extras: dict[str, np.ndarray],
        scores: np.ndarray,
        labels: np.ndarray,
        weights: np.ndarray,
        arrays: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        """Cross-fitted selective metrics, and the same for the three baselines at the same coverage.

        The selective figures come from the out-of-fold probabilities and
        acceptance flags. The baselines are cross-fitted on the same folds:
        recalibration alone (Platt or temperature, all rows accepted),
        confidence-based rejection (the least confident recalibrated
        predictions rejected) and Isolation Forest rejection (the least
        typical selector inputs rejected: the features, or the score in
        scores-only mode), each rejecting at a threshold set on its fold's
        training part to accept a share beta.

        Then the guard (module docstring): when the selective figures are far worse than
        recalibration alone's and ``guard`` is on, this calibrator becomes recalibration
        alone, and ``out_of_fold`` and ``extras["accepted"]`` are overwritten in place with
        that baseline's (the same folds), so that the rest of the summary describes what
        is served.
        """
        summary: dict[str, Any] = {"beta": float(self.beta), "mode": self.mode}
        accepted = extras.get("accepted")
        if accepted is None:
            return {"selective": summary}
        summary["selective_recalibration"] = rejection_metrics(out_of_fold, labels, weights, accepted)
        features = arrays.get("features")
        folds = stratified_folds(labels, CROSS_FIT_SPLITS, CROSS_FIT_SEED)
        baselines = cross_fitted_baselines(scores, labels, weights, features, self.input, self.beta, folds, self.seed)
        for name, (probabilities, flags) in baselines.items():
            summary[name] = rejection_metrics(probabilities, labels, weights, flags)
        summary["isolation_forest"]["on"] = "features" if features is not None else "scores"
        if self.selector_ is not None:
            guard = guard_verdict(summary["selective_recalibration"], summary["recalibration_alone"], self.guard)
            if guard["fell_back"]:
                alone, _ = baselines["recalibration_alone"]
                out_of_fold[...] = alone
                accepted[...] = True
                self._fall_back(scores, labels, weights)
            self.guard_ = guard
            summary["guard"] = guard
        return {"selective": summary}

    def _fall_back(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        """Become recalibration alone: h fitted on every row, every input accepted (features,
        if fitted with them, are still required so that clients need not change)."""
        self.recalibrator_ = _fit_recalibrator(scores, labels, weights, self.input)
        self.selector_ = None
        self.threshold_, self.threshold_logit_ = 0.0, None
        self.coverage_ = {
            "target": float(self.beta), "reached": 1.0, "interval": [1.0, 1.0], "confidence": self.confidence, "n_rows": 0,
        }

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        self._check_fitted()
        selector = None
        if self.selector_ is not None:
            selector = {
                "input": self.selector_["input"],
                "n_inputs": self.selector_["n_inputs"],
                "mean": self.selector_["mean"].tolist(),
                "scale": self.selector_["scale"].tolist(),
                "layers": [layer.tolist() for layer in self.selector_["layers"]],
            }
        params = self.get_params()
        params["hidden"] = [int(w) for w in params["hidden"]]
        state = {
            "recalibrator": _parameters_info(self.recalibrator_),
            "selector": selector,
            "threshold": self.threshold_,
            "threshold_logit": self.threshold_logit_,
            "coverage": self.coverage_,
            "training": self.training_,
            "score_ndim": int(self.score_ndim_),
            "guard": getattr(self, "guard_", None),
        }
        return {"method": self.method, "params": params, "n_classes": getattr(self, "n_classes_", 2), "state": state}

    @classmethod
    def _from_state(cls, params: dict[str, Any], state: dict[str, Any]) -> SelectiveCalibrator:
        calibrator = cls(**params)
        recalibrator = state["recalibrator"]
        inner: Calibrator
        if recalibrator["kind"] == "temperature":
            inner = TemperatureCalibrator(input=calibrator.input)
            inner.temperature_ = float(recalibrator["temperature"])
        else:
            inner = PlattCalibrator(input=calibrator.input)
            inner.a_, inner.b_ = float(recalibrator["a"]), float(recalibrator["b"])
        calibrator.recalibrator_ = inner
        selector = state["selector"]
        if selector is not None:
            selector = {
                "input": selector["input"],
                "n_inputs": int(selector["n_inputs"]),
                "mean": np.asarray(selector["mean"], dtype=np.float64),
                "scale": np.asarray(selector["scale"], dtype=np.float64),
                "layers": [np.asarray(layer, dtype=np.float64) for layer in selector["layers"]],
            }
        calibrator.selector_ = selector
        calibrator.threshold_ = float(state["threshold"])
        logit = state["threshold_logit"]
        calibrator.threshold_logit_ = None if logit is None else float(logit)
        calibrator.coverage_ = dict(state["coverage"])
        calibrator.training_ = dict(state["training"])
        calibrator.score_ndim_ = int(state["score_ndim"])
        guard = state.get("guard")
        calibrator.guard_ = None if guard is None else dict(guard)
        calibrator.n_classes_ = 2
        return calibrator


# -- helpers ------------------------------------------------------------------------------


def score_feature(scores: np.ndarray, input: str) -> np.ndarray:
    """The selector's input in scores-only mode, shape (n, 1): the class-1 logit (binary) or the
    logit of the top-label confidence, z_k - logsumexp_{j != k} z_j (multiclass)."""
    if scores.ndim == 1:
        return np.clip(to_logit(scores, input), -50.0, 50.0)[:, None]
    z = as_logits(scores, input)
    rows = np.arange(z.shape[0])
    top = z.argmax(axis=1)
    others = z.copy()
    others[rows, top] = -np.inf
    return np.clip(z[rows, top] - _logsumexp_rows(others), -50.0, 50.0)[:, None]


def stratified_holdout(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A mask of about ``fraction`` of the rows, the same share of each label, never all of a label's rows."""
    held = np.zeros(labels.shape[0], dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rng.shuffle(members)
        take = min(int(round(fraction * members.shape[0])), members.shape[0] - 1)
        held[members[:take]] = True
    if not held.any():
        # Tiny holdouts: still set tau on a row the selector did not see.
        largest = np.bincount(labels).argmax()
        members = np.flatnonzero(labels == largest)
        held[members[rng.integers(members.shape[0])]] = True
    return held


def coverage_threshold(s: np.ndarray, beta: float) -> float:
    """The largest t with mean(s >= t) >= beta: the k-th smallest s, k = floor((1 - beta) n)."""
    ordered = np.sort(s)
    k = int(math.floor((1.0 - beta) * ordered.shape[0] + 1e-9))
    return float(ordered[min(k, ordered.shape[0] - 1)])


def hoeffding_half_width(n: int, delta: float) -> float:
    """sqrt(log(2 / delta) / (2 n)): coverage on fresh data is within this of the held-out share
    with probability >= 1 - delta."""
    return math.sqrt(math.log(2.0 / delta) / (2.0 * n))


def _fit_recalibrator(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, input: str) -> Calibrator:
    """Pre-training of h alone: calibd's Platt (binary) or temperature (multiclass) fit."""
    inner: Calibrator = TemperatureCalibrator(input=input) if scores.ndim == 2 else PlattCalibrator(input=input)
    inner._fit(scores, labels, weights)
    return inner


def _parameters(inner: Calibrator) -> np.ndarray:
    if isinstance(inner, TemperatureCalibrator):
        return np.array([math.log(inner.temperature_)])
    return np.array([inner.a_, inner.b_])


def _with_parameters(inner: Calibrator, params: np.ndarray) -> Calibrator:
    if isinstance(inner, TemperatureCalibrator):
        inner.temperature_ = float(math.exp(params[0]))
    else:
        inner.a_, inner.b_ = float(params[0]), float(params[1])
    return inner


def _parameters_info(inner: Calibrator) -> dict[str, Any]:
    if isinstance(inner, TemperatureCalibrator):
        return {"kind": "temperature", "temperature": float(inner.temperature_)}
    return {"kind": "platt", "a": float(inner.a_), "b": float(inner.b_)}


def minimise_recalibration(
    params: np.ndarray, data: RecalibrationData, row_weights: np.ndarray, max_iter: int = 50
) -> np.ndarray:
    """h's parameters minimising sum_i q_i l_i(h), q = w g_hat normalised (the loss for fixed g_hat).

    Newton's method on the one or two parameters: the analytic gradient, a Hessian
    from central differences of it, and step halving until the loss does not
    increase (so the iteration is monotone). Log T stays within calibd's
    temperature bounds.
    """
    total = row_weights.sum()
    if not total > 0:
        return params
    q = row_weights / total

    def evaluate(theta: np.ndarray) -> tuple[float, np.ndarray]:
        losses, grads = recalibration_losses(theta, data)
        return float(np.dot(q, losses)), q @ grads

    low, high = (math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)) if data.multiclass else (-1e4, 1e4)
    theta = np.clip(np.asarray(params, dtype=np.float64), low, high)
    value, grad = evaluate(theta)
    size = theta.shape[0]
    for _ in range(max_iter):
        hessian = np.empty((size, size))
        for j in range(size):
            h = 1e-5 * (1.0 + abs(theta[j]))
            offset = np.zeros(size)
            offset[j] = h
            hessian[:, j] = (evaluate(theta + offset)[1] - evaluate(theta - offset)[1]) / (2.0 * h)
        hessian = 0.5 * (hessian + hessian.T)
        try:
            eigenvalues = np.linalg.eigvalsh(hessian)
            step = np.linalg.solve(hessian, grad) if eigenvalues.min() > 1e-12 * max(1.0, eigenvalues.max()) else grad
        except np.linalg.LinAlgError:
            step = grad
        scale = 1.0
        while True:
            candidate = np.clip(theta - scale * step, low, high)
            candidate_value, candidate_grad = evaluate(candidate)
            if candidate_value <= value + 1e-12 * abs(value) or scale < 1e-10:
                break
            scale *= 0.5
        moved = np.max(np.abs(candidate - theta))
        if candidate_value <= value + 1e-12 * abs(value):
            theta, value, grad = candidate, candidate_value, candidate_grad
        if moved <= 1e-10 * (1.0 + np.max(np.abs(theta))) or scale < 1e-10:
            break
    return theta


# -- metrics and baselines (fit summaries, tests and benchmarks/selective.py) -----------------


def accuracy(probabilities: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """Weighted share of rows whose predicted class (class 1 when p > 0.5; the argmax of rows) is the label."""
    predicted = (probabilities > 0.5).astype(labels.dtype) if probabilities.ndim == 1 else probabilities.argmax(axis=1)
    return float(np.average(predicted == labels, weights=weights))


def top_label_confidence(probabilities: np.ndarray) -> np.ndarray:
    return np.maximum(probabilities, 1.0 - probabilities) if probabilities.ndim == 1 else probabilities.max(axis=1)


def rejection_metrics(
    probabilities: np.ndarray, labels: np.ndarray, weights: np.ndarray, accepted: np.ndarray
) -> dict[str, Any]:
    """Coverage, ECE and Brier on the accepted rows, accuracy on accepted and on all rows.

    ECE is of the positive class for binary probabilities and top-label for rows
    (15 equal-width bins, calibd.metrics.ece); coverage is the unweighted share accepted.
    """
    accepted = np.asarray(accepted, dtype=bool)
    kept = accepted & (weights > 0)
    target = "binary" if probabilities.ndim == 1 else "top_label"
    result: dict[str, Any] = {
        "coverage": float(accepted.mean()),
        "n_accepted": int(accepted.sum()),
        "accuracy_all": accuracy(probabilities, labels, weights),
    }
    if kept.any():
        p, y, w = probabilities[kept], labels[kept], weights[kept]
        result |= {
            "ece": ece(p, y, sample_weight=w, target=target),
            "brier": brier(p, y, w),
            "accuracy_accepted": accuracy(p, y, w),
        }
    else:
        result |= {"ece": None, "brier": None, "accuracy_accepted": None}
    return result


def guard_verdict(selective: dict[str, Any], alone: dict[str, Any], enabled: bool = True) -> dict[str, Any]:
    """Whether cross-fitted selective recalibration is far worse calibrated than recalibration alone.

    Far worse: ECE on the accepted rows above twice recalibration alone's (every row), and
    the gap above 0.5 sqrt(15 / n_accepted), about the binned ECE (15 bins) of a perfectly
    calibrated predictor on that many rows: a gap within sampling noise is not evidence.
    """
    selective_ece, alone_ece, n = selective.get("ece"), alone.get("ece"), int(selective.get("n_accepted", 0))
    noise = 0.5 * math.sqrt(15.0 / max(n, 1))
    far_worse = selective_ece is None or (
        alone_ece is not None and selective_ece > 2.0 * alone_ece and selective_ece - alone_ece > noise
    )
    verdict = {
        "ece_accepted": selective_ece,
        "ece_recalibration_alone": alone_ece,
        "noise": noise,
        "far_worse": bool(far_worse),
        "fell_back": bool(far_worse and enabled),
    }
    if verdict["fell_back"]:
        verdict["action"] = "served recalibration alone (every input accepted): the selective fit was far worse calibrated"
    elif far_worse:
        verdict["action"] = "kept the selective fit (guard off), although it was far worse calibrated"
    return verdict


def quantile_accept(train_values: np.ndarray, test_values: np.ndarray, beta: float) -> np.ndarray:
    """Accept test rows whose value reaches the threshold that accepts a share beta of the training rows."""
    if beta >= 1.0:
        return np.ones(test_values.shape[0], dtype=bool)
    return test_values >= coverage_threshold(train_values, beta)


class Baselines:
    """The three baselines fitted on one training set: recalibration alone (h on every row),
    confidence-based rejection (top-label confidence of h) and Isolation Forest on the
    selector inputs (features, or the score feature in scores-only mode; higher
    ``score_samples`` is more typical). ``accepted(beta, ...)`` rejects at a threshold that
    accepts a share beta of the training rows."""

    def __init__(self, scores, labels, weights, input: str, features=None, seed: int = 0, n_estimators: int = 100):
        from sklearn.ensemble import IsolationForest

        self.input = input
        self.recalibrator = _fit_recalibrator(scores, labels, weights, input)
        self.uses_features = features is not None
        inputs = features if features is not None else score_feature(scores, input)
        self.forest = IsolationForest(n_estimators=n_estimators, random_state=seed).fit(inputs)
        self.train_confidence = top_label_confidence(self.recalibrator._predict(scores))
        self.train_typicality = self.forest.score_samples(inputs)

    def predict(self, scores, features=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(recalibrated probabilities, top-label confidence, Isolation Forest typicality)."""
        probabilities = self.recalibrator._predict(scores)
        inputs = features if self.uses_features else score_feature(scores, self.input)
        return probabilities, top_label_confidence(probabilities), self.forest.score_samples(inputs)

    def accepted(self, beta: float, confidence: np.ndarray, typicality: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "recalibration_alone": np.ones(confidence.shape[0], dtype=bool),
            "confidence_rejection": quantile_accept(self.train_confidence, confidence, beta),
            "isolation_forest": quantile_accept(self.train_typicality, typicality, beta),
        }


def cross_fitted_baselines(
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    features: np.ndarray | None,
    input: str,
    beta: float,
    folds: np.ndarray,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Out-of-fold (probabilities, accepted) of each baseline."""
    probabilities: np.ndarray | None = None
    flags = {name: np.zeros(labels.shape[0], dtype=bool) for name in ("recalibration_alone", "confidence_rejection", "isolation_forest")}
    for fold in np.unique(folds):
        test = folds == fold
        train = ~test
        fitted = Baselines(
            scores[train], labels[train], weights[train], input, None if features is None else features[train], seed
        )
        p, confidence, typicality = fitted.predict(scores[test], None if features is None else features[test])
        if probabilities is None:
            probabilities = np.empty((labels.shape[0], *p.shape[1:]))
        probabilities[test] = p
        for name, accepted in fitted.accepted(beta, confidence, typicality).items():
            flags[name][test] = accepted
    return {name: (probabilities, accepted) for name, accepted in flags.items()}
