"""The pool of fit worker processes.

Fits run in worker processes (spawned, at idle CPU priority, one BLAS thread each), so that
a long fit neither holds the serving process's GIL nor delays /calibrate. A fit that runs past
its time is stopped by killing its worker; a crashed worker is replaced. The job a worker runs
is the pool's ``task``; asynchronous jobs report progress through ``worker_progress``.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .spool import sweep_spool


class PoolError(Exception):
    """The pool could not finish a job: it ran past its time, or its worker died.

    ``retry_after``: seconds after which the same job may succeed (None: not by waiting)."""

    def __init__(self, detail: str, retry_after: int | None = None):
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


# In a worker process: where progress reports go (set by the pool's initializer).
_progress_queue: Any = None


def worker_progress(job_id: str | None) -> Callable[[float, str], None] | None:
    """In a worker: a function that reports ``(fraction, stage)`` of job ``job_id`` to the pool
    (None for a job without id, or outside a worker)."""
    if job_id is None or _progress_queue is None:
        return None
    queue = _progress_queue

    def progress(fraction: float, stage: str) -> None:
        queue.put((job_id, fraction, stage))

    return progress


def _ready() -> bool:
    return True


def _timed(task: Callable[..., dict[str, Any]], job: Any) -> tuple[dict[str, Any], float]:
    """``task(job, None)`` and the seconds it ran in this worker (the rest of a fit's wall time is waiting)."""
    started = time.perf_counter()
    outcome = task(job, None)
    return outcome, time.perf_counter() - started


def init_worker(progress_queue: Any = None, warm_up: Callable[[], None] | None = None) -> None:
    """Warm up (``warm_up``: a small job, so that the first real one finds its modules imported),
    then run jobs at lower CPU priority, report progress to ``progress_queue``, and die with the
    serving process (Linux)."""
    global _progress_queue
    _progress_queue = progress_queue
    # Ctrl-C reaches the whole process group; the serving process stops this worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One BLAS thread: fits are single-threaded by design, and on a busy machine
    # threaded BLAS only contends with the serving process.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    if warm_up is not None:
        # At normal priority: at SCHED_IDLE, on a busy machine, the warm-up (and so readiness) could wait minutes.
        warm_up()
    lower_priority()
    die_with_parent()


def init_background_worker() -> None:
    """For a process that does the serving process's background work: it ignores Ctrl-C, runs at
    nice 10 and dies with the serving process. Not SCHED_IDLE, as fits are: this work holds database
    locks that requests wait for (a calibrator's maturity row), and a busy machine could starve it
    while it holds them."""
    init_side_process()
    try:
        os.nice(10)
    except OSError:  # not permitted here: run at normal priority
        pass


def init_side_process() -> None:
    """For a process that works for the serving process: Ctrl-C, sent to the whole process group,
    is the serving process's to handle (a side process that died of it would be started again while
    the server drains), and it dies with the serving process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def die_with_parent() -> None:
    """Exit once the serving process is gone, even after ``kill -9``: a thread checks every second.
    Not PR_SET_PDEATHSIG: that fires when the *thread* that started this process ends, and a pool
    may be (re)started from a worker thread of the serving process, which ends when idle."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    threading.Thread(target=_exit_when_orphaned, args=(parent.pid,), daemon=True, name="orphan watch").start()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:  # reparented once the parent died, even while this process imported
        time.sleep(1)
    os._exit(0)


def lower_priority() -> None:
    """Let fits use only CPU time that serving does not want.

    SCHED_IDLE (Linux) runs the worker only when no normal task is runnable, so a
    calibration request preempts a fit at once; nice 10 alone still gives a fit
    about a tenth of a contended core, which shows in /calibrate's tail latency.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):  # not Linux, or not permitted
        pass
    try:
        os.nice(10)
    except OSError:  # not permitted here: run at normal priority
        pass


class FitPool:
    """A pool of fit worker processes. ``workers=0`` fits in a thread of this process instead."""

    def __init__(
        self,
        workers: int,
        timeout_seconds: float,
        spool_dir: str | None = None,
        task: Callable[[Any, Callable[[float, str], None] | None], dict[str, Any]] | None = None,
        warm_up: Callable[[], None] | None = None,
    ):
        self.workers = workers
        #: What a worker runs for each job: ``task(job, progress)`` (a module-level function,
        #: so that it pickles by name), returning a dict of plain values.
        self.task = task
        #: What each worker runs once when it starts (module-level too), before it takes jobs.
        self.warm_up = warm_up
        self.timeout_seconds = timeout_seconds
        #: Where large bodies are spooled (None: /dev/shm where writable, else the temporary directory).
        self.spool_dir = spool_dir
        self._executor: ProcessPoolExecutor | None = None
        self._started: Future | None = None
        #: The start of the workers begun at start-up: readiness waits for it (``warm``).
        self._first_start: Future | None = None
        #: The latest (fraction, stage) reported by each running asynchronous fit.
        self.progress: dict[str, tuple[float, str]] = {}

    def start(self) -> None:
        """Remove the spool files of stopped processes, and start the workers now (in the
        background), so that the first fit does not wait for them."""
        sweep_spool(self.spool_dir)
        if self.workers:
            self._pool()
            self._first_start = self._started

    def warm(self) -> bool:
        """Whether the workers started at start-up are warm (or failed to start, which a fit then
        reports). /readyz waits for it, so the first fit after a start is as fast as the next."""
        return self._first_start is None or self._first_start.done()

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=context, initializer=init_worker, initargs=(queue, self.warm_up)
            )
            self._started = self._executor.submit(_ready)  # done once a worker has started and warmed up
            self._queue = queue
            self._collector = threading.Thread(target=self._collect_progress, args=(queue,), daemon=True)
            self._collector.start()
        return self._executor

    def _collect_progress(self, queue: Any) -> None:
        while True:
            try:
                report = queue.get()
            except (EOFError, OSError, ValueError):
                return
            if report is None:  # the pool was stopped
                return
            job_id, fraction, stage = report
            self.progress[job_id] = (fraction, stage)

    async def fit(self, job: Any) -> tuple[dict[str, Any], float]:
        """What ``task`` returned for ``job``, and the seconds the job waited: for a worker (one
        starting, or busy with another job) and for its data to reach it and come back.
        Raises PoolError for a timeout or a crashed worker."""
        asked = time.perf_counter()
        if self.workers == 0:

            def progress(fraction: float, stage: str) -> None:
                if job.job_id is not None:
                    self.progress[job.job_id] = (fraction, stage)

            outcome = await asyncio.wait_for(asyncio.to_thread(self.task, job, progress), self.timeout_seconds)
            return outcome, 0.0
        else:
            pool = self._pool()
            try:
                # A worker's start (imports take seconds) does not count against the fit's timeout.
                await asyncio.wrap_future(self._started)
                future = pool.submit(_timed, self.task, job)
                outcome, ran = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_seconds)
            except asyncio.TimeoutError:
                self._restart()
                raise PoolError(
                    f"the fit took longer than {self.timeout_seconds:g} s (CALIBD_FIT_TIMEOUT_SECONDS) and was stopped"
                ) from None
            except BrokenProcessPool:
                self._restart()
                raise PoolError(
                    "the fit worker stopped unexpectedly (out of memory?); try a smaller holdout", retry_after=5
                ) from None
        return outcome, max(0.0, time.perf_counter() - asked - ran)

    def _restart(self, wait: bool = False) -> None:
        """Kill the workers (a timed-out fit cannot be cancelled otherwise) and start afresh on next use."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        self._queue.put(None)
        for process in list((getattr(executor, "_processes", None) or {}).values()):
            process.kill()
        executor.shutdown(wait=wait, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers; a fit still running was never acknowledged, so nothing is lost.

        Everything the pool holds is released here, before the process ends: uvicorn ends a
        signalled process by raising the signal again, past atexit, so queues left for exit
        would stay registered with multiprocessing's resource tracker, which then warns of
        "leaked semaphore objects" at every stop.
        """
        queue, collector = getattr(self, "_queue", None), getattr(self, "_collector", None)
        self._restart(wait=True)  # the executor's queues closed, its threads joined
        if queue is not None:
            if collector is not None:
                collector.join(timeout=5)
            queue.close()
            queue.join_thread()
        self._queue = self._collector = None
        del queue, collector
        gc.collect()  # the queues' semaphores are unlinked as their objects go
