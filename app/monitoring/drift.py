"""An anytime-valid test of calibration drift for binary probabilities.

Labelled feedback arrives in batches of pairs (p_i, y_i). ``DriftTest`` keeps
a nonnegative process M_t, the *e-process*, with M_0 = 1 and the property

    P(M_t >= 1/alpha for some t) <= alpha                            (1)

whenever the null hypothesis holds, however many batches are looked at and
whatever the batch sizes are. It alarms, and the alarm latches, at the first
batch with log M_t >= log(1/alpha).

Null hypothesis
---------------
Write eta_i = logit(q_i) for the true probability q_i = P(y_i = 1 | p_i, past)
and z_i = logit(p_i) (p clipped to [1e-12, 1 - 1e-12]). The null, calibration
within ``tolerance`` on the logit scale, is

    H0(tol):  |eta_i - z_i| <= tol  for every i,

a composite null; tol = 0 is exact calibration. "past" is everything seen
before label i: earlier batches and the predictions of the current one. For
i.i.d. feedback q_i is just the calibration curve at p_i. Feedback must not be
selected by its label (labels that only arrive when positive break any test).

Construction
------------
A label is Bernoulli with natural parameter eta and cumulant
A(eta) = log(1 + e^eta). An *expert* k proposes, for each label, an
alternative eta^A_i that is *predictable*: a function of z_i, of the current
batch's predictions and of earlier batches only, never of current labels. It
is projected onto the null band,

    eta^0_i = z_i + clip(eta^A_i - z_i, -tol, tol),   Delta_i = eta^A_i - eta^0_i,

and bets with the likelihood ratio of eta^A_i against eta^0_i,

    LR_i = exp(Delta_i y_i - A(eta^0_i + Delta_i) + A(eta^0_i))
         = exp(Delta_i y_i) / (1 + p^0_i (e^Delta_i - 1)),   p^0_i = sigmoid(eta^0_i).

Validity. Under a true eta, E[exp(Delta y)] = exp(A(eta + Delta) - A(eta)), so

    log E_eta[LR_i] = [A(eta + Delta) - A(eta)] - [A(eta^0 + Delta) - A(eta^0)].

As A is convex, x -> A(x + Delta) - A(x) is increasing for Delta > 0 and
decreasing for Delta < 0. If Delta > 0 the projection put eta^0 at the upper
band edge z + tol, and any null eta <= z + tol = eta^0, so the bracket
difference is <= 0; symmetrically for Delta < 0; Delta = 0 gives LR = 1. So
E[LR_i | past] <= 1 for *every* distribution in H0(tol) (= 1 for tol = 0).
Taking the labels of a batch one at a time (the expert's eta^A depends on none
of them), the tower rule gives E[prod_i LR_i | past] <= 1: no independence
within a batch is needed.

A fixed alternative multiplied from the start loses about the KL divergence
per label while the null holds (some 9 nats per batch of 2,000 labels at a 5%
base rate for a 0.4 logit shift), so it cannot catch a drift that begins
late. The e-process therefore mixes over the start of the drift as well as
over experts, as the Shiryaev-Roberts statistic does: with prior weights
v_k (sum 1) and a prior on the start G (survival function on the number of
labels seen, G(0) = 1), batch t adds start mass w_t = G(N_{t-1}) - G(N_t) and

    S_k(t) = (S_k(t-1) + w_t) * L_k(t),     L_k(t) = prod_{i in batch t} LR_i^(k),
    M_t    = sum_k v_k S_k(t) + G(N_t),                                  (2)

with S_k(0) = 0. Then E[M_t | past] <= sum_k v_k (S_k(t-1) + w_t) + G(N_t)
= M_{t-1}: M is a nonnegative supermartingale with M_0 = 1 under every null
distribution, and Ville's inequality (Ville 1939) gives (1). Equivalently, M_t
is a fixed-weight average, over the label s at which drift starts (prior mass
G(s-1) - G(s)) and over experts, of the products of L_k(t) over the batches
from the one holding label s: each is a test supermartingale for the same
filtration, and so is their average. As the prior is on labels, not batches,
the service may cut feedback into batches any way it likes. Here
G(N) = (1 + N/restart_scale)^(-1/2): 29% of the start mass lies on the first
``restart_scale`` labels (drift present from the start), and a start among
the n labels after the first N has mass about
(n / (2 restart_scale)) (1 + N/restart_scale)^(-3/2), a cost logarithmic in N
(4 nats for a batch of 2,000 after 16,000 labels at the default scale).

Experts, all of the form eta^A = z + b + (a - 1)(z - c) with the pivot
c = logit(mean of the predictions so far, current batch included):

* logit shifts, a = 1, b = +-(tol + theta) for theta on a geometric grid
  of 11 points from 0.05 to 2 (half the prior mass); measured from the band
  edge, so that no weight sits on alternatives inside the null;
* slope changes a in {0.5, 0.7, 0.85, 1.2, 1.4, 2} with b in {-0.2, 0, 0.2}
  (a quarter);
* two plug-in experts (a quarter), which estimate (a, b) from *earlier*
  batches only by one Newton step of logistic regression from (1, 0), with a
  small ridge, clipped to a in [0.2, 5], b in [-3, 3]: one on all the past,
  one forgetting with a half-life of ``restart_scale`` labels, so that it
  follows a drift that began late. The estimate uses five discounted sums,
  so the state stays small.

The state (log S_k, batch and label counts, the plug-in sums) is a few dozen
floats; ``to_dict``/``from_dict`` store it in plain JSON types, and a resumed
test gives bit-identical results.

References
----------
J. Ville, Etude critique de la notion de collectif (1939).
G. Shafer, A. Shen, N. Vereshchagin, V. Vovk, "Test martingales, Bayes
factors and p-values", Statistical Science 26 (2011).
A. Ramdas, P. Grunwald, V. Vovk, G. Shafer, "Game-theoretic statistics and
safe anytime-valid inference", Statistical Science 38 (2023).
S. Arnold, A. Henzi, J. Ziegel, "Sequentially valid tests for forecast
calibration", Annals of Applied Statistics 17 (2023).
J. Shin, A. Ramdas, A. Rinaldo, "E-detectors: a nonparametric framework for
sequential change detection", New England Journal of Statistics in Data
Science (2023).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import expit, logsumexp

from calibd.calibration.base import EPS, CalibrationInputError, as_float_array

__all__ = ["DriftResult", "DriftTest", "ParallelDriftResult", "ParallelDriftTests"]

STATE_VERSION = 1

# Logit shifts beyond the tolerance: ratio 1.45 between neighbours, so the
# best grid point keeps at least 95% of the optimal growth rate in between.
SHIFTS = np.geomspace(0.05, 2.0, 11)
SLOPES = (0.5, 0.7, 0.85, 1.2, 1.4, 2.0)
SLOPE_OFFSETS = (-0.2, 0.0, 0.2)
# Prior mass of the three families of experts.
SHIFT_MASS, SLOPE_MASS, PLUGIN_MASS = 0.5, 0.25, 0.25
# Plug-in estimate: ridge (in units of Fisher information, ~ a few hundred
# labels at a 5% base rate) and the box it is clipped to.
PLUGIN_RIDGE = 10.0
PLUGIN_SLOPE_RANGE = (0.2, 5.0)
PLUGIN_OFFSET_RANGE = (-3.0, 3.0)
# Exponent of the start-time prior G(N) = (1 + N / restart_scale)^-RESTART_POWER.
RESTART_POWER = 0.5


def logit(p: np.ndarray) -> np.ndarray:
    # Clipped so that p = 0 or 1 gives a large but finite logit (+-27.6).
    p = np.clip(p, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


@dataclass(frozen=True)
class Experts:
    """The fixed experts (a, b) and the prior weights of every expert."""

    slope: np.ndarray  # (n_fixed,) a
    offset: np.ndarray  # (n_fixed,) b
    half_lives: tuple[float, ...]  # plug-in experts, in labels
    log_weight: np.ndarray  # (n_fixed + n_plugin,)
    names: tuple[str, ...]
    n_shifts: int  # the first n_shifts experts are logit shifts (a = 1)

    @classmethod
    def build(
        cls, tolerance: float, restart_scale: float, shifts: np.ndarray = SHIFTS,
        masses: tuple[float, float, float] = (SHIFT_MASS, SLOPE_MASS, PLUGIN_MASS),
    ) -> Experts:
        """Shifts +-(tolerance + shifts) sharing ``masses[0]`` equally, then the slopes and plug-ins."""
        shift = np.concatenate([tolerance + shifts, -(tolerance + shifts)])
        slope_a, slope_b = (g.ravel() for g in np.meshgrid(SLOPES, SLOPE_OFFSETS, indexing="ij"))
        slope = np.concatenate([np.ones_like(shift), slope_a])
        offset = np.concatenate([shift, slope_b])
        half_lives = (math.inf, float(restart_scale))
        weight = np.concatenate([np.full(shift.size, masses[0] / shift.size),
                                 np.full(slope_a.size, masses[1] / slope_a.size),
                                 np.full(len(half_lives), masses[2] / len(half_lives))])
        names = (
            [f"shift{b:+.3g}" for b in shift]
            + [f"slope{a:.3g}{b:+.3g}" for a, b in zip(slope_a, slope_b)]
            + [f"plugin(half_life={h:g})" for h in half_lives]
        )
        return cls(slope, offset, half_lives, np.log(weight), tuple(names), shift.size)

    @property
    def size(self) -> int:
        return self.log_weight.size


@dataclass
class DriftState:
    """Everything the test remembers, for m streams side by side."""

    n_batches: int
    n_samples: int
    sum_p: np.ndarray  # (m,) sum of predictions, for the pivot c
    log_s: np.ndarray  # (m, K) log S_k; -inf before the first batch
    plugin: np.ndarray  # (m, H, 5) discounted sums w, w z, w z^2, r, r z
    alarm: np.ndarray  # (m,) bool
    alarm_batch: np.ndarray  # (m,) int, 0 while no alarm

    @classmethod
    def empty(cls, n_streams: int, experts: Experts) -> DriftState:
        return cls(
            n_batches=0,
            n_samples=0,
            sum_p=np.zeros(n_streams),
            log_s=np.full((n_streams, experts.size), -np.inf),
            plugin=np.zeros((n_streams, len(experts.half_lives), 5)),
            alarm=np.zeros(n_streams, dtype=bool),
            alarm_batch=np.zeros(n_streams, dtype=np.int64),
        )


def _log_prior_survival(n_samples: float, restart_scale: float) -> float:
    """log G(N): prior mass of a drift that starts after the first N labels."""
    return -RESTART_POWER * math.log1p(n_samples / restart_scale)


def _log_start_mass(n_before: int, n_batch: int, restart_scale: float) -> float:
    """log(G(N) - G(N + n)), without cancellation when N is large."""
    step = RESTART_POWER * math.log1p(n_batch / (restart_scale + n_before))
    return _log_prior_survival(n_before, restart_scale) + math.log(-math.expm1(-step))


class BatchKernel:
    """sum_i log LR_i over one batch, for experts eta^A - z = b + (a - 1) x, x = z - c.

    log LR_i = Delta_i y_i - log(1 + p0_i (e^Delta_i - 1)), with Delta the part
    of the deviation beyond the band and p0 the probability at the band edge
    on the deviation's side. The batch-wide sums and two scratch arrays are
    shared by all experts: the loop over experts is the hot path.
    """

    def __init__(self, z, pivot, p, y, tolerance: float):
        self.x = z - pivot
        self.y, self.tolerance = y, tolerance
        if tolerance > 0.0:
            self.p_up, self.p_down = expit(z + tolerance), expit(z - tolerance)
            self.delta, self.edge = np.empty_like(z), np.empty_like(z)
        else:
            self.p_up = self.p_down = p
        self.sum_y = y.sum(axis=1)
        self.sum_xy = (self.x * y).sum(axis=1)
        self.work = np.empty_like(z)

    def shift(self, b: float):
        """An expert with a = 1: the same deviation b for every label."""
        tol = self.tolerance
        delta = b - min(max(b, -tol), tol)
        p0 = self.p_up if b > 0.0 else self.p_down
        work = np.multiply(p0, math.expm1(delta), out=self.work)
        np.log1p(work, out=work)
        return delta * self.sum_y - work.sum(axis=1)

    def shifts(self, b: np.ndarray) -> np.ndarray:
        """``shift`` for many offsets at once: (m, len(b)), one pass over a (m, len(b), n) array."""
        tol = self.tolerance
        delta = b - np.clip(b, -tol, tol)
        p0 = np.where(b[None, :, None] > 0.0, self.p_up[:, None, :], self.p_down[:, None, :])
        work = np.log1p(p0 * np.expm1(delta)[None, :, None])
        return delta[None, :] * self.sum_y[:, None] - work.sum(axis=2)

    def line(self, a, b):
        """An expert with slope a and offset b, scalars or arrays of shape (m, 1)."""
        work = np.multiply(self.x, a - 1.0, out=self.work)
        work += b
        if self.tolerance == 0.0:
            # Delta is linear in x: its sum against y needs no pass of its own.
            gain = np.ravel(b) * self.sum_y + np.ravel(a - 1.0) * self.sum_xy
            np.expm1(work, out=work)
            work *= self.p_up
        else:
            tol = self.tolerance
            delta = np.clip(work, -tol, tol, out=self.delta)
            np.subtract(work, delta, out=delta)
            edge = self.edge
            np.copyto(edge, self.p_down)
            np.copyto(edge, self.p_up, where=work > 0.0)
            gain = np.multiply(delta, self.y, out=work).sum(axis=1)
            np.expm1(delta, out=work)
            work *= edge
        np.log1p(work, out=work)
        return gain - work.sum(axis=1)


def _plugin_estimate(stats: np.ndarray, pivot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One Newton step of logistic regression of y on (1, z - c) from (a, b) = (1, 0).

    ``stats`` (m, 5) are the sums of w, w z, w z^2, r, r z with w = p(1 - p),
    r = y - p over past labels; returns (a, b), each (m,).
    """
    sw, swz, swzz, sr, srz = np.moveaxis(stats, -1, 0)
    # Centre at the pivot: x = z - c.
    swx = swz - pivot * sw
    swxx = swzz - 2.0 * pivot * swz + pivot**2 * sw
    srx = srz - pivot * sr
    h00, h01, h11 = sw + PLUGIN_RIDGE, swx, swxx + PLUGIN_RIDGE
    det = h00 * h11 - h01**2
    offset = (h11 * sr - h01 * srx) / det
    slope = 1.0 + (h00 * srx - h01 * sr) / det
    return np.clip(slope, *PLUGIN_SLOPE_RANGE), np.clip(offset, *PLUGIN_OFFSET_RANGE)


def advance(
    state: DriftState, experts: Experts, z, p, y, tolerance: float, log_start_mass, log_survival: float,
    log_threshold: float, vector_shifts: bool = False,
):
    """Fold one batch (arrays (m, n)) into ``state`` in place; returns log M_t (m,).

    The batch's log start mass (a float or (m,)) joins every S_k before its bets; M_t adds
    exp(log_survival). ``vector_shifts``: all shift experts in one array pass (small batches).
    """
    n = z.shape[1]
    state.sum_p = state.sum_p + p.sum(axis=1)
    pivot = logit(state.sum_p / (state.n_samples + n))[:, None]
    kernel = BatchKernel(z, pivot, p, y, tolerance)

    log_lr = np.empty(state.log_s.shape)
    n_fixed = experts.slope.size
    first = 0
    if vector_shifts:
        first = experts.n_shifts
        log_lr[:, :first] = kernel.shifts(experts.offset[:first])
    for k in range(first, n_fixed):
        a, b = float(experts.slope[k]), float(experts.offset[k])
        log_lr[:, k] = kernel.shift(b) if a == 1.0 else kernel.line(a, b)
    for h in range(len(experts.half_lives)):
        # Estimated from earlier batches only: the sums are updated below.
        a, b = _plugin_estimate(state.plugin[:, h], pivot[:, 0])
        log_lr[:, n_fixed + h] = kernel.line(a[:, None], b[:, None])

    log_w = np.reshape(log_start_mass, (-1, 1))
    state.log_s = np.logaddexp(state.log_s, log_w) + log_lr
    state.n_samples += n
    state.n_batches += 1
    with np.errstate(divide="ignore"):
        log_m = np.logaddexp(logsumexp(state.log_s + experts.log_weight, axis=1), log_survival)

    # Sufficient statistics of the plug-in fit, now that the batch has been bet on.
    w = p * (1.0 - p)
    r = y - p
    batch_stats = np.stack(
        [w.sum(axis=1), (w * z).sum(axis=1), (w * z * z).sum(axis=1), r.sum(axis=1), (r * z).sum(axis=1)],
        axis=-1,
    )
    decay = np.array([0.5 ** (n / h) for h in experts.half_lives])
    state.plugin = state.plugin * decay[None, :, None] + batch_stats[:, None, :]

    fired = ~state.alarm & (log_m >= log_threshold)
    state.alarm = state.alarm | fired
    state.alarm_batch = np.where(fired, state.n_batches, state.alarm_batch)
    return log_m


def check_params(alpha: Any, tolerance: Any, restart_scale: Any) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise CalibrationInputError("options.alpha", "must be a number strictly between 0 and 1")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0.0 <= tolerance < 10.0:
        raise CalibrationInputError("options.tolerance", "must be a number in [0, 10) (a logit distance)")
    if isinstance(restart_scale, bool) or not isinstance(restart_scale, (int, float)) or not restart_scale > 0:
        raise CalibrationInputError("options.restart_scale", "must be a positive number of labels")


def check_batch(probabilities: Any, labels: Any, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite probabilities in [0, 1] and 0/1 labels of the same shape, not empty."""
    p = as_float_array(probabilities, "probabilities", ndim=ndim)
    if p.shape[-1] == 0:
        raise CalibrationInputError("probabilities", "must not be empty")
    outside = (p < 0.0) | (p > 1.0)
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        raise CalibrationInputError("probabilities", "must lie in [0, 1]", index)
    labels = np.asarray(labels)
    if labels.dtype == bool:
        labels = labels.astype(np.int8)
    y = as_float_array(labels, "labels", ndim=ndim)
    if y.shape != p.shape:
        raise CalibrationInputError(
            "labels", f"has shape {y.shape} but probabilities has shape {p.shape}; they must match"
        )
    bad = (y != 0.0) & (y != 1.0)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CalibrationInputError("labels", "binary labels must be 0 or 1", index)
    return p, y


@dataclass(frozen=True)
class DriftResult:
    """The state of a drift test after a batch.

    ``alarm`` latches: once ``log_evalue`` has reached ``log_threshold``
    (= log(1/alpha)) it stays true until ``reset``. ``alarm_batch`` is the
    1-based number of the batch that raised it. ``top_alternative`` names the
    expert that holds the largest share of the evidence (e.g. ``shift+0.4``:
    the outcomes look like a logit shift of +0.4).
    """

    alarm: bool
    log_evalue: float
    log_threshold: float
    n_batches: int
    n_samples: int
    alarm_batch: int | None
    top_alternative: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ParallelDriftResult:
    """``DriftResult`` for many streams: arrays of shape (n_streams,)."""

    alarm: np.ndarray
    log_evalue: np.ndarray
    alarm_batch: np.ndarray  # 0 where no alarm
    n_batches: int
    n_samples: int


class _DriftBase:
    def __init__(self, alpha: float, tolerance: float, restart_scale: float):
        check_params(alpha, tolerance, restart_scale)
        self.alpha = alpha
        self.tolerance = tolerance
        self.restart_scale = restart_scale
        self.log_threshold = -math.log(alpha)
        self._experts = Experts.build(float(tolerance), float(restart_scale))

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "tolerance": self.tolerance, "restart_scale": self.restart_scale}

    @property
    def alternatives(self) -> tuple[str, ...]:
        """Names of the experts, in the order of the state's ``log_s``."""
        return self._experts.names

    def _step(self, p: np.ndarray, y: np.ndarray) -> np.ndarray:
        p = np.clip(p, EPS, 1.0 - EPS)
        scale, n_before = float(self.restart_scale), self._state.n_samples
        return advance(
            self._state, self._experts, logit(p), p, y, float(self.tolerance),
            _log_start_mass(n_before, p.shape[1], scale), _log_prior_survival(n_before + p.shape[1], scale),
            self.log_threshold,
        )

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"


class DriftTest(_DriftBase):
    """Sequential test of calibration within a logit tolerance; anytime-valid.

    Under the null hypothesis the probability that the alarm is *ever*
    raised is at most ``alpha``, however many batches are fed and however
    often the result is read.

    Parameters
    ----------
    alpha : float, default 0.05
        Bound on the probability, under the null, of ever raising the alarm.
    tolerance : float, default 0.0
        Null hypothesis: every true probability is within ``tolerance`` of the
        prediction on the logit scale (0: exact calibration). A service should
        use a positive value, since no fitted calibrator is exactly calibrated
        and an exact null fed endless feedback alarms eventually.
    restart_scale : float, default 2000
        Number of labels that sets the prior on when drift begins (see the
        module docstring); about the feedback volume between two looks.

    Examples
    --------
    >>> test = DriftTest(alpha=0.05, tolerance=0.1)
    >>> test.update([0.1, 0.7, 0.4], [0, 1, 0]).alarm
    False
    """

    def __init__(self, alpha: float = 0.05, tolerance: float = 0.0, restart_scale: float = 2000.0):
        super().__init__(alpha, tolerance, restart_scale)
        self.reset()

    def reset(self) -> DriftTest:
        """Forget all feedback and start a fresh test (a new calibrator version)."""
        self._state = DriftState.empty(1, self._experts)
        self._log_evalue = 0.0
        return self

    def update(self, probabilities, labels) -> DriftResult:
        """Bet on one batch of feedback: predicted probabilities and their 0/1 labels."""
        p, y = check_batch(probabilities, labels, ndim=1)
        self._log_evalue = float(self._step(p[None, :], y[None, :])[0])
        return self.result()

    def result(self) -> DriftResult:
        """The current state, as the last ``update`` returned it."""
        state = self._state
        top = None
        if state.n_batches:
            top = self._experts.names[int(np.argmax(state.log_s[0] + self._experts.log_weight))]
        return DriftResult(
            alarm=bool(state.alarm[0]),
            log_evalue=self._log_evalue,
            log_threshold=self.log_threshold,
            n_batches=state.n_batches,
            n_samples=state.n_samples,
            alarm_batch=int(state.alarm_batch[0]) if state.alarm[0] else None,
            top_alternative=top,
        )

    # -- persistence -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Parameters and state in plain JSON types; floats round-trip exactly through JSON."""
        state = self._state
        return {
            "kind": "drift_test",
            "version": STATE_VERSION,
            "params": self.get_params(),
            "state": {
                "n_batches": state.n_batches,
                "n_samples": state.n_samples,
                "sum_p": float(state.sum_p[0]),
                # S_k = 0 (log -inf, not JSON) before the first batch: stored as [].
                "log_s": [float(v) for v in state.log_s[0]] if state.n_batches else [],
                "plugin": [[float(v) for v in row] for row in state.plugin[0]],
                "log_evalue": self._log_evalue,
                "alarm": bool(state.alarm[0]),
                "alarm_batch": int(state.alarm_batch[0]) if state.alarm[0] else None,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DriftTest:
        """Rebuild a test from ``to_dict`` output; it continues exactly where it stopped."""
        if not isinstance(data, dict) or data.get("kind") != "drift_test":
            raise ValueError("not a drift test state")
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported drift test state version {data.get('version')!r}")
        try:
            test = cls(**data["params"])
            saved = data["state"]
            state = DriftState.empty(1, test._experts)
            state.n_batches = int(saved["n_batches"])
            state.n_samples = int(saved["n_samples"])
            state.sum_p = np.array([float(saved["sum_p"])])
            if state.n_batches:
                state.log_s = np.array([saved["log_s"]], dtype=np.float64)
            plugin = np.array([saved["plugin"]], dtype=np.float64)
            alarm_batch = saved["alarm_batch"]
            state.alarm = np.array([bool(saved["alarm"])])
            state.alarm_batch = np.array([int(alarm_batch) if state.alarm[0] else 0])
            log_evalue = float(saved["log_evalue"])
        except (KeyError, TypeError, ValueError, CalibrationInputError) as error:
            raise ValueError(f"invalid drift test state: {error}") from None
        if state.log_s.shape != (1, test._experts.size) or (state.n_batches and not np.isfinite(state.log_s).all()):
            raise ValueError(f"invalid drift test state: log_s must hold {test._experts.size} finite numbers")
        if plugin.shape != state.plugin.shape or not np.isfinite(plugin).all():
            raise ValueError(f"invalid drift test state: plugin must be {state.plugin.shape[1:]} finite numbers")
        if state.n_batches < 0 or state.n_samples < state.n_batches or (state.alarm[0] and alarm_batch is None):
            raise ValueError("invalid drift test state: inconsistent counts")
        state.plugin = plugin
        test._state = state
        test._log_evalue = log_evalue
        return test


class ParallelDriftTests(_DriftBase):
    """``n_streams`` independent ``DriftTest`` s fed side by side, for simulations.

    ``update`` takes arrays of shape (n_streams, n): row j is the next batch
    of stream j. It runs the same arithmetic as ``DriftTest``, vectorised
    over streams, and gives bit-identical e-values.
    """

    def __init__(self, n_streams: int, alpha: float = 0.05, tolerance: float = 0.0, restart_scale: float = 2000.0):
        if isinstance(n_streams, bool) or not isinstance(n_streams, (int, np.integer)) or n_streams < 1:
            raise CalibrationInputError("n_streams", "must be a positive integer")
        self.n_streams = int(n_streams)
        super().__init__(alpha, tolerance, restart_scale)
        self.reset()

    def get_params(self) -> dict[str, Any]:
        return {"n_streams": self.n_streams, **super().get_params()}

    def reset(self) -> ParallelDriftTests:
        self._state = DriftState.empty(self.n_streams, self._experts)
        return self

    def update(self, probabilities, labels) -> ParallelDriftResult:
        """Bet on one batch per stream; arrays of shape (n_streams, n)."""
        p, y = check_batch(probabilities, labels, ndim=2)
        if p.shape[0] != self.n_streams:
            raise CalibrationInputError("probabilities", f"must have {self.n_streams} rows, one per stream")
        log_m = self._step(p, y)
        state = self._state
        return ParallelDriftResult(
            alarm=state.alarm.copy(),
            log_evalue=log_m,
            alarm_batch=state.alarm_batch.copy(),
            n_batches=state.n_batches,
            n_samples=state.n_samples,
        )
