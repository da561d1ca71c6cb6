"""One spawned process that runs work for the serving process: work whose Python, run in a thread,
would hold the serving process's GIL while requests wait (the /metrics monitor read, the maturity
step). Started at the first call, replaced when it dies, killed on close."""

from __future__ import annotations

import importlib
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sqlalchemy import make_url


def shares_database(url: str) -> bool:
    """Whether another process opening ``url`` sees this process's database (not an in-memory SQLite,
    written plainly or as a URI: ``sqlite:///file:name?mode=memory&uri=true``)."""
    if not url.startswith("sqlite"):
        return True
    parsed = make_url(url)
    database = parsed.database or ""
    return not (database in ("", ":memory:") or database.startswith("file::memory:")
                or parsed.query.get("mode") == "memory")


def _import(module: str) -> bool:
    importlib.import_module(module)
    return True


class SideProcess:
    """Runs module-level functions of ``module`` in one spawned process of its own, which imports
    ``module`` when it starts.

    ``initializer`` (module-level, no arguments) runs once in the process when it starts: to lower
    its CPU priority, say.
    """

    def __init__(self, module: str, initializer: Callable[[], None] | None = None):
        self.module = module
        self.initializer = initializer
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._started: Future | None = None
        self._closed = False

    def started(self) -> bool:
        """Whether the process has started and imported ``module`` (a second or two after the first
        call); starts it if need be."""
        return self._start()[1].done()

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the process, waited for (without the GIL). A dead process raises
        BrokenProcessPool, and a new one starts at the next call."""
        executor, _ = self._start()
        try:
            return executor.submit(function, *args).result()
        except BrokenProcessPool:
            with self._lock:
                if self._executor is executor:
                    self._executor = None
            raise

    def close(self) -> None:
        """Kill the process (work it was doing is not waited for: the callers' work is transactional)."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._closed = True
        if executor is not None:
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                process.kill()
            executor.shutdown(wait=True, cancel_futures=True)

    def _start(self) -> tuple[ProcessPoolExecutor, Future]:
        with self._lock:
            if self._closed:  # a background job still running as the app stops
                raise RuntimeError("the side process is closed")
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"), initializer=self.initializer
                )
                self._started = self._executor.submit(_import, self.module)
            return self._executor, self._started
