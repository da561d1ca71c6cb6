"""A fit runs with one BLAS thread, and the process's own setting comes back afterwards."""

from __future__ import annotations

import threading

import numpy as np
import pytest

threadpoolctl = pytest.importorskip("threadpoolctl")

from calibd.calibration._threads import single_threaded_blas  # noqa: E402
from calibd.calibration.multicalibration import MulticalibrationCalibrator  # noqa: E402


def blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]


@pytest.fixture
def two_blas_threads():
    if not blas_threads():
        pytest.skip("no BLAS library loaded that threadpoolctl can see")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        if set(blas_threads()) != {2}:
            pytest.skip("BLAS cannot run two threads here")
        yield blas_threads()


def test_overlapping_fits_share_one_limit_restored_when_the_last_ends(two_blas_threads):
    inside_first, second_started, first_left = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[int]] = {}

    def second() -> None:
        assert inside_first.wait(5)
        with single_threaded_blas():
            second_started.set()
            assert first_left.wait(5)
            seen["second, after the first ended"] = blas_threads()

    thread = threading.Thread(target=second)
    thread.start()
    with single_threaded_blas():
        seen["first"] = blas_threads()
        inside_first.set()
        assert second_started.wait(5), "the second fit did not start while the first ran"
    first_left.set()
    thread.join(5)
    assert not thread.is_alive()
    assert seen["first"] == [1] * len(two_blas_threads)
    assert seen["second, after the first ended"] == [1] * len(two_blas_threads)
    assert blas_threads() == two_blas_threads


def test_multicalibration_fits_on_one_blas_thread(two_blas_threads, monkeypatch):
    from calibd.calibration import multicalibration

    during: list[list[int]] = []
    fit_logistic = multicalibration.fit_logistic

    def observed(*args, **kwargs):
        during.append(blas_threads())
        return fit_logistic(*args, **kwargs)

    monkeypatch.setattr(multicalibration, "fit_logistic", observed)  # an observer: the fit itself runs unchanged
    rng = np.random.default_rng(0)
    scores = rng.uniform(0.05, 0.95, 2000)
    labels = (rng.uniform(size=2000) < scores).astype(int)
    MulticalibrationCalibrator().fit(scores, labels, features={"a": rng.choice(["x", "y"], 2000)})
    assert during and all(threads == [1] * len(two_blas_threads) for threads in during)
    assert blas_threads() == two_blas_threads
