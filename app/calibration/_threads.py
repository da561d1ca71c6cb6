"""One BLAS thread while a fit runs.

The fits' matrix products and solves are small (a selector's batch of 128 rows, a Bernstein
design of a few hundred columns, a segment stage's Newton steps): threaded BLAS only adds
synchronisation, which on a busy 2-core machine made them several times slower. calibd's fit
workers run with one BLAS thread already (app/workers/pool.py); this gives a fit called as a
library, or in the serving process, the same.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_users = 0
_limiter: Any = None
_controller: Any = None  # threadpoolctl's scan of the loaded libraries, made once (milliseconds)


def _take_control() -> None:
    """Let this thread change OpenBLAS's process-wide limit. threadpoolctl (3.8 and later) lets only
    one "controlling" thread change it and silently ignores the others; fits run in whichever thread
    calls them, and the one that restores the limit is not always the one that set it."""
    try:
        from threadpoolctl import OpenBLASController

        OpenBLASController.clear_controlling_thread(force=True)
    except (ImportError, AttributeError, TypeError):  # an older threadpoolctl: any thread may set it
        pass


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the block with BLAS limited to one thread (process-wide, restored afterwards).

    Overlapping fits in several threads share one limit, set by the first to start and restored
    by the last to end, whichever threads they are. Without threadpoolctl (a scikit-learn
    dependency), or where it cannot act, the block runs as it is.
    """
    global _users, _limiter, _controller
    with _lock:
        if _users == 0:
            try:
                if _controller is None:
                    from threadpoolctl import ThreadpoolController

                    _controller = ThreadpoolController()
                _take_control()
                _limiter = _controller.limit(limits=1, user_api="blas")
            except Exception:  # threadpoolctl missing or unable to act: run as is
                _limiter = None
            finally:
                _take_control()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _limiter is not None:
                _take_control()
                try:
                    _limiter.restore_original_limits()
                finally:
                    _take_control()
                    _limiter = None
