"""The segment drift tests of one calibrator version: one e-process per segment, one budget for all.

Every (dimension, value) segment runs the betting e-process of
``calibd.monitoring.drift`` (logit-shift, slope and plug-in experts, each
label's bet projected onto the null band |logit shift| <= tolerance), with two
changes that make small segments fast without giving up the family-wise
guarantee.

One budget, given out by label
------------------------------
The global test mixes over the label at which drift starts with a prior
G (survival function, G(0) = 1). The segment tests share one such prior over
the labels of the whole version (every row that reaches the segment
monitors), and the start mass of each label, g_i = G(i - 1) - G(i), goes to
the segments that label belongs to, 1/D to its segment in each of the D
declared dimensions. A batch of n labels after the first N gives

    w = G(N) - G(N + n),    segment j of a dimension gets  w n_j / (D n),      (1)

n_j of the batch's labels being in segment j. Segment j's e-process is the
Shiryaev-Roberts-like sum over its experts k (prior weights v_k),

    S_jk(t) = (S_jk(t - 1) + w_j(t)) L_jk(t),     M_j(t) = sum_k v_k S_jk(t),   (2)

with S_jk(0) = 0 and L_jk(t) the product of the expert's likelihood ratios
over segment j's labels of batch t. Segment j alarms when M_j(t) >= 1/alpha,
where alpha is the calibrator's own.

Family-wise guarantee. Let R(t) = G(N_t) be the mass not yet given out. For
any set I0 of segments whose feedback is calibrated within the tolerance,
R(t) + sum_{j in I0} M_j(t) is a nonnegative supermartingale with value 1 at
t = 0: each S_jk of a null segment is one under the bets (E[L | past] <= 1, as
in ``drift``), and mass leaving R either stays in it, enters a null segment,
or leaves the sum (a drifting segment). The shares (1) depend on how many
labels each segment has, never on their values, so they are fixed before the
bets they fund. Any null segment alarming means this process reached
1/alpha, so by Ville's inequality

    P(some segment whose feedback is calibrated ever alarms) <= alpha,         (3)

however many segments and batches, whatever the dependence between segments
(a row is in one segment of every dimension) and however the feedback is cut
into batches. The assumptions are the global test's: within a segment, each
label is calibrated within the tolerance given everything before it (its
prediction, its segment, the earlier labels), and labels are not selected by
their value (see the label window for late labels).

Why this is faster than splitting alpha over declared capacity: a segment's
share follows its traffic (a segment with 10% of the labels holds 10% of each
batch's start mass), segments that never appear hold none, and the
threshold is log(1/alpha) for all. The price of a drift that starts after N
labels is log(1/w) for the start, as in the global test.

The experts: logit shifts beyond the band on a fine geometric grid from 0.05
to 2.5 (36 sizes a side, ratio 1.12, equal weights: a log-uniform mixture over
the shift size, which costs about half the log of the evidence rather than the
log of the grid size) hold 90% of the prior, the slope experts 7%, the plug-in
experts 3%. For one stream all shift experts are computed in one array pass,
so the test costs about what the global one with its 42 experts does.

References: J. Ville (1939); J. Shin, A. Ramdas, A. Rinaldo, "E-detectors"
(2023), for mixtures over change points; V. Vovk, R. Wang, "E-values:
calibration, combination and applications" (2021).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibd.calibration.base import EPS, CalibrationInputError

from .drift import (
    RESTART_POWER, DriftResult, DriftState, Experts, ParallelDriftResult, advance, check_batch, check_params, logit,
)

__all__ = ["FAMILY_SCALE", "ParallelSegmentDriftTests", "SegmentDriftTest", "start_mass"]

STATE_KIND, STATE_VERSION = "segment_drift_test", 1

SEGMENT_SHIFTS = np.geomspace(0.05, 2.5, 36)
SEGMENT_MASSES = (0.9, 0.07, 0.03)
#: Labels of the version (all segments) that set the start prior G(N) = (1 + N / scale)^-1/2.
FAMILY_SCALE = 20_000.0
#: Half-life, in the segment's labels, of the forgetting plug-in expert.
PLUGIN_HALF_LIFE = 2000.0


def start_mass(given: float, n_labels: int, scale: float = FAMILY_SCALE) -> float:
    """Equation (1)'s w: the start mass of the next ``n_labels``, when ``given`` of the budget is out.

    G(N) = 1 - given locates N, so nothing but the mass given so far is
    stored; the answer never exceeds what is left, so the total stays <= 1.
    """
    left = 1.0 - given
    if left <= 0.0 or n_labels <= 0:
        return 0.0
    n_before = scale * (left ** (-1.0 / RESTART_POWER) - 1.0)
    after = (1.0 + (n_before + n_labels) / scale) ** -RESTART_POWER
    return float(min(left, max(0.0, left - after)))


class _SegmentBase:
    def __init__(self, alpha: float, tolerance: float):
        check_params(alpha, tolerance, PLUGIN_HALF_LIFE)
        self.alpha, self.tolerance = alpha, tolerance
        self.log_threshold = -math.log(alpha)
        self._experts = Experts.build(float(tolerance), PLUGIN_HALF_LIFE, SEGMENT_SHIFTS, SEGMENT_MASSES)

    def get_params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "tolerance": self.tolerance}

    def _step(self, p: np.ndarray, y: np.ndarray, mass) -> np.ndarray:
        mass = np.asarray(mass, dtype=np.float64)
        if (mass < 0.0).any() or not np.isfinite(mass).all():
            raise CalibrationInputError("start_mass", "must be finite and >= 0")
        p = np.clip(p, EPS, 1.0 - EPS)
        with np.errstate(divide="ignore"):
            log_mass = np.log(mass)
        return advance(self._state, self._experts, logit(p), p, y, float(self.tolerance), log_mass, -math.inf,
                       self.log_threshold, vector_shifts=p.shape[0] == 1)


class SegmentDriftTest(_SegmentBase):
    """One segment's test: equation (2), fed the segment's labels and its start mass (1).

    ``log_evalue`` is log M_j: minus infinity until the segment holds start
    mass, then the log of its share of the family's wealth; the alarm
    (latched) is log M_j >= log(1/alpha).
    """

    def __init__(self, alpha: float = 0.05, tolerance: float = 0.0):
        super().__init__(alpha, tolerance)
        self._state = DriftState.empty(1, self._experts)
        self._log_evalue = -math.inf
        self.mass = 0.0  # start mass received so far

    def update(self, probabilities, labels, start_mass: float) -> DriftResult:
        """Receive ``start_mass``, then bet on the segment's batch of feedback."""
        p, y = check_batch(probabilities, labels, ndim=1)
        self._log_evalue = float(self._step(p[None, :], y[None, :], start_mass)[0])
        self.mass += float(start_mass)
        return self.result()

    def result(self) -> DriftResult:
        state = self._state
        top = None
        if state.n_batches and np.isfinite(self._log_evalue):
            top = self._experts.names[int(np.argmax(state.log_s[0] + self._experts.log_weight))]
        return DriftResult(
            alarm=bool(state.alarm[0]), log_evalue=self._log_evalue, log_threshold=self.log_threshold,
            n_batches=state.n_batches, n_samples=state.n_samples,
            alarm_batch=int(state.alarm_batch[0]) if state.alarm[0] else None, top_alternative=top,
        )

    def to_dict(self) -> dict[str, Any]:
        """Parameters and state in plain JSON types (log S = -inf, no mass yet, stored as null)."""
        state = self._state

        def finite(v: float):
            return float(v) if math.isfinite(v) else None

        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "params": self.get_params(),
            "state": {
                "n_batches": state.n_batches,
                "n_samples": state.n_samples,
                "sum_p": float(state.sum_p[0]),
                "mass": self.mass,
                "log_s": [finite(v) for v in state.log_s[0]],
                "plugin": [[float(v) for v in row] for row in state.plugin[0]],
                "log_evalue": finite(self._log_evalue),
                "alarm": bool(state.alarm[0]),
                "alarm_batch": int(state.alarm_batch[0]) if state.alarm[0] else None,
            },
        }

    @classmethod
    def is_state(cls, data: Any) -> bool:
        """Whether ``data`` is this test's state (an older test's state is not)."""
        return isinstance(data, dict) and data.get("kind") == STATE_KIND and data.get("version") == STATE_VERSION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SegmentDriftTest:
        """Rebuild a test from ``to_dict`` output; it continues exactly where it stopped."""
        if not cls.is_state(data):
            raise ValueError("not a segment drift test state")
        try:
            test = cls(**data["params"])
            saved = data["state"]
            state = DriftState.empty(1, test._experts)
            state.n_batches, state.n_samples = int(saved["n_batches"]), int(saved["n_samples"])
            state.sum_p = np.array([float(saved["sum_p"])])
            log_s = np.array([[-math.inf if v is None else float(v) for v in saved["log_s"]]])
            plugin = np.array([saved["plugin"]], dtype=np.float64)
            state.alarm = np.array([bool(saved["alarm"])])
            state.alarm_batch = np.array([int(saved["alarm_batch"]) if state.alarm[0] else 0])
            log_evalue = -math.inf if saved["log_evalue"] is None else float(saved["log_evalue"])
            mass = float(saved["mass"])
        except (KeyError, TypeError, ValueError, CalibrationInputError) as error:
            raise ValueError(f"invalid segment drift test state: {error}") from None
        if log_s.shape != state.log_s.shape or plugin.shape != state.plugin.shape or not np.isfinite(plugin).all():
            raise ValueError("invalid segment drift test state: wrong shapes")
        state.log_s, state.plugin = log_s, plugin
        test._state, test._log_evalue, test.mass = state, log_evalue, mass
        return test


class ParallelSegmentDriftTests(_SegmentBase):
    """``n_streams`` independent ``SegmentDriftTest`` s side by side, for simulations (same arithmetic)."""

    def __init__(self, n_streams: int, alpha: float = 0.05, tolerance: float = 0.0):
        super().__init__(alpha, tolerance)
        self.n_streams = int(n_streams)
        self._state = DriftState.empty(self.n_streams, self._experts)

    def update(self, probabilities, labels, start_mass) -> ParallelDriftResult:
        """One batch per stream (arrays (n_streams, n)) and its start mass (a number or (n_streams,))."""
        p, y = check_batch(probabilities, labels, ndim=2)
        log_m = self._step(p, y, start_mass)
        state = self._state
        return ParallelDriftResult(alarm=state.alarm.copy(), log_evalue=log_m, alarm_batch=state.alarm_batch.copy(),
                                   n_batches=state.n_batches, n_samples=state.n_samples)
