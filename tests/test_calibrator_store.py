"""The serving process's calibrator store never goes back to an older current version: a database read
that straddles a promotion made here, or a refresh, is not applied over it."""

from __future__ import annotations

import numpy as np
import pytest

from calibd.calibration.platt import PlattCalibrator
from calibd.storage import repository
from calibd.storage.cache import CalibratorStore
from calibd.storage.db import make_engine, make_sessionmaker


def two_versions(sessions, name: str) -> None:
    """Versions 1 (current) and 2 (a candidate) of ``name``."""
    for version, slope in ((1, 1.0), (2, 3.0)):
        model = PlattCalibrator().fit(np.linspace(0.05, 0.95, 40), (np.linspace(0, 1, 40) < 0.5 / slope + 0.25).astype(int))
        repository.create_version(
            sessions, name=name, method="platt", input_kind="probability", n_classes=2, classes=None,
            parameters=model.to_dict(), summary={}, holdout_sha256=str(version) * 64, n_samples=40, fit_seconds=0.0,
            promote=version == 1,
        )


@pytest.fixture
def sessions(fresh_database):
    engine = make_engine(fresh_database)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.mark.parametrize("meanwhile", ["a promotion here", "a refresh after a promotion elsewhere"])
def test_a_read_that_straddles_a_change_of_the_current_version_does_not_undo_it(sessions, monkeypatch, meanwhile):
    name = "straddled"
    two_versions(sessions, name)
    store = CalibratorStore(sessions, 10_000_000)
    store.refresh()
    assert store.load(name, None).version == 1
    read = repository.get_version

    def read_then_promote(sessions_, name_, version):
        info = read(sessions_, name_, version)  # says version 1 is current
        promoted = repository.promote(sessions, name, 2)
        if meanwhile == "a promotion here":
            store.set_current(promoted.name, promoted.uid, promoted.current_version)
        else:
            assert store.refresh()
        return info

    monkeypatch.setattr(repository, "get_version", read_then_promote)
    assert store.load(name, 1).version == 1  # version 1 was not cached under its own key: a miss
    monkeypatch.setattr(repository, "get_version", read)
    served = store.get(name, None) or store.load(name, None)
    assert served.version == 2
