"""The in-process view of the registry that keeps /calibrate off the database.

Three maps live in memory:
- ``name -> (uid, current version)``, refreshed by ``refresh()`` (polled about
  twice a second) when the database's registry generation has moved, and
  updated at once by this process's own fits, promotions and deletions;
- ``name -> stored predictor`` (transformer mode), refreshed and updated the same way;
- a byte-bounded LRU of loaded calibrators keyed by ``(uid, version)``.
  Versions are immutable and a re-created name gets a new uid, so an entry
  can never be stale; it only ages out.

After warm-up a request resolves its calibrator without touching the
database, and keeps doing so while the database is down.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..calibration import Calibrator, from_dict
from . import predictors, repository
from .repository import NoCurrentVersion, NotFound, Sessions, VersionHeader, VersionInfo


@dataclass(frozen=True)
class LoadedCalibrator(VersionHeader):
    """A version ready to serve: its header, and the calibrator built from its parameters."""

    calibrator: Calibrator
    nbytes: int


def estimate_nbytes(value: Any) -> int:
    """Rough memory held by a fitted calibrator: its arrays plus a fixed overhead."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(getattr(value, "nbytes", None), int):  # e.g. isotonic's lookup grid
        return value.nbytes
    if isinstance(value, Calibrator):
        return 1024 + sum(estimate_nbytes(v) for v in vars(value).values())
    if isinstance(value, dict):
        return 64 * len(value) + sum(estimate_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 8 * len(value) + sum(estimate_nbytes(v) for v in value)
    return 32


class CalibratorStore:
    def __init__(self, sessions: Sessions, max_bytes: int):
        self._sessions = sessions
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._current: dict[str, tuple[str, int | None]] = {}
        self._predictors: dict[str, dict[str, Any]] = {}
        self._predictors_read = False
        self._generation: int | None = None
        #: Bumped by each change of the current-version map (this process's own, or a refresh): a
        #: database read that straddles one may predate it, and is not applied to the map.
        self._changes = 0
        self._loaded: OrderedDict[tuple[str, int], LoadedCalibrator] = OrderedDict()
        self._loaded_bytes = 0

    # -- the hot path: memory only ------------------------------------------
    def get(self, name: str, version: int | None) -> LoadedCalibrator | None:
        """The calibrator if it is resolvable from memory, else None (call ``load``)."""
        entry = self._current.get(name)
        if entry is None:
            return None
        uid, current = entry
        key = (uid, current if version is None else version)
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is not None:
                self._loaded.move_to_end(key)
        return loaded

    def predictor(self, name: str) -> dict[str, Any] | None:
        """The calibrator's stored predictor; None if it has none or is unknown. From memory once
        ``refresh()`` has read the map (``predictors_known``), else from the database."""
        if not self._predictors_read:
            try:
                return predictors.get_predictor(self._sessions, name)
            except NotFound:
                return None
        return self._predictors.get(name)

    @property
    def predictors_known(self) -> bool:
        return self._predictors_read

    # -- misses: one database read --------------------------------------------
    def load(self, name: str, version: int | None) -> LoadedCalibrator:
        """Read the version from the database and cache it. Raises NotFound, NoCurrentVersion."""
        with self._lock:
            changes = self._changes
        info = repository.get_version(self._sessions, name, version)
        loaded = self._cache(info)
        with self._lock:
            # A promotion here, or a refresh, while this read ran may be newer than what it read.
            if changes == self._changes:
                self._current[name] = (info.uid, info.current_version)
        return loaded

    def _cache(self, info: VersionInfo) -> LoadedCalibrator:
        calibrator = from_dict(info.parameters)
        calibrator.prepare()  # lookup tables built now, off the request path, and counted below
        loaded = LoadedCalibrator(**info.header(), calibrator=calibrator, nbytes=estimate_nbytes(calibrator))
        key = (info.uid, info.version)
        with self._lock:
            previous = self._loaded.pop(key, None)
            if previous is not None:
                self._loaded_bytes -= previous.nbytes
            self._loaded[key] = loaded
            self._loaded_bytes += loaded.nbytes
            # Keep at least the newest entry even if it alone exceeds the budget.
            while self._loaded_bytes > self._max_bytes and len(self._loaded) > 1:
                _, evicted = self._loaded.popitem(last=False)
                self._loaded_bytes -= evicted.nbytes
        return loaded

    # -- this process's own changes -------------------------------------------
    def stored(self, info: VersionInfo) -> None:
        """A version was just committed by this process: cache it and its name's current version."""
        self._cache(info)
        self.set_current(info.name, info.uid, info.current_version)

    def set_current(self, name: str, uid: str, version: int | None) -> None:
        with self._lock:
            self._current[name] = (uid, version)
            self._changes += 1

    def forget(self, name: str) -> None:
        with self._lock:
            self._current.pop(name, None)
            self._predictors.pop(name, None)
            self._changes += 1

    def set_predictor(self, name: str, value: dict[str, Any] | None) -> None:
        with self._lock:
            if value is None:
                self._predictors.pop(name, None)
            else:
                self._predictors[name] = value
            self._changes += 1

    # -- other processes' changes ----------------------------------------------
    def refresh(self) -> bool:
        """Reload the current-version map if the registry generation moved. Returns True if reloaded.

        The generation is read before the map, so the map is at least as new as
        the generation recorded; a local change made while reading discards the
        read (it may predate that change) and forces another next time.
        """
        with self._lock:
            changes = self._changes
        generation = repository.registry_generation(self._sessions)
        if generation == self._generation:
            return False
        current = repository.current_versions(self._sessions)
        stored_predictors = predictors.all_predictors(self._sessions)
        with self._lock:
            if changes != self._changes:
                self._generation = None
                return False
            self._current = current
            self._predictors = stored_predictors
            self._predictors_read = True
            self._generation = generation
            self._changes += 1
        return True

    @property
    def cached_bytes(self) -> int:
        return self._loaded_bytes

    def __len__(self) -> int:
        return len(self._loaded)


__all__ = ["CalibratorStore", "LoadedCalibrator", "NoCurrentVersion", "NotFound"]
