"""What calls return: fitted versions, calibrations, feedback receipts, evaluations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

@dataclass(frozen=True)
class CalibratorVersion:
    """A stored version, as a fit or an import answers: ``version`` and ``summary`` above all."""

    name: str
    version: int
    current: bool
    method: str
    n_samples: int
    summary: dict[str, Any] = field(repr=False)
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CalibratorVersion:
        return cls(data["name"], data["version"], data["current"], data["method"], data["n_samples"], data.get("summary") or {}, data)

    def __repr__(self) -> str:
        chosen = f", chose={self.chosen!r}" if self.chosen else ""

        def rounded(metrics: dict[str, Any]) -> dict[str, Any]:
            return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}

        return (
            f"CalibratorVersion(name={self.name!r}, version={self.version}, current={self.current}, "
            f"method={self.method!r}{chosen}, n_samples={self.n_samples}, "
            f"before={rounded(self.before)}, after={rounded(self.after)})"
        )

    @property
    def chosen(self) -> str | None:
        """The method ``auto`` chose, if this is an ``auto`` fit."""
        return (self.summary.get("fit") or {}).get("chosen")

    @property
    def before(self) -> dict[str, float]:
        """Metrics of the raw holdout scores (``ece``, ``brier``, ``log_loss``)."""
        return self.summary.get("before", {})

    @property
    def after(self) -> dict[str, float]:
        """Metrics of the calibrated holdout, cross-fitted (never scored by a calibrator that saw the row)."""
        return self.summary.get("after", {})


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` returns: ``probabilities`` (numpy), the ``version`` that made them, and
    per-row ``extras`` (``intervals``, ``accepted``, ``decisions``...), also readable as attributes."""

    calibrator: str
    version: int
    probabilities: np.ndarray
    extras: dict[str, Any] = field(default_factory=dict)
    #: The class of each column (binary: of class 1 at index 1), when the calibrator was fitted on class names.
    classes: list[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or extra {name!r}")

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.probabilities if dtype is None else self.probabilities.astype(dtype)

    def __len__(self) -> int:
        return len(self.probabilities)


@dataclass(frozen=True)
class FeedbackReceipt:
    count: int
    unknown_ids: list[str]
    expired_ids: list[str]
    #: The Idempotency-Key sent (one per call, reused by its retries).
    idempotency_key: str
    #: True when the service had already recorded this request (a retry), and answered from its record.
    replayed: bool = False
    #: Labels stored to wait for a prediction not logged yet (their ids are ``unknown_ids``); joined when it is.
    pending: int = 0
    #: Ids labelled before (the first label wins) or repeated in the call: not recorded again.
    duplicate_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Evaluation:
    """``metrics``: name -> {"value", "ci", "params", ...}; ``reliability``: the diagram's bins."""

    metrics: dict[str, dict[str, Any]]
    reliability: dict[str, Any]

    @property
    def values(self) -> dict[str, float | None]:
        return {name: metric["value"] for name, metric in self.metrics.items()}
