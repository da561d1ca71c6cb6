"""Fits run in worker processes, so that a large fit never stalls /calibrate.

The main process only reads the request body; parsing, validation, fitting
and the cross-fitted summary all happen in a worker process at lower CPU
priority (SCHED_IDLE on Linux, else ``nice``), which returns plain data: the stored parameters and
summary, or the problem to answer with. A fit that runs past
CALIBD_FIT_TIMEOUT_SECONDS is killed with its worker, which is replaced; so
is a worker that dies (out of memory, say), without taking the service down.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import glob
import logging
import multiprocessing
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...calibration import CalibrationInputError, fit_calibrator
from ..bodies import check_depth, parse_json_object
from ..problems import Problem, input_error
from ..validation import validate
from ...monitoring.segments import check_declaration
from .schemas import FitRequest
from .upload import parse_arrow_fit, parse_upload


@dataclass(frozen=True)
class FitJob:
    """What a worker needs: the raw JSON body (in memory, or spooled to ``body_file``), or an
    upload's fields and file."""

    body: bytes | None = None
    #: A spooled JSON body (``spool_json_body``); the worker reads it, ``discard_spool`` removes it.
    body_file: str | None = None
    fields: dict[str, str] | None = None
    #: An upload's file: its bytes, or the path of a spooled Parquet file (``spool_upload``).
    file: bytes | str | None = None
    #: "arrow": the body is an Arrow IPC stream, and ``fields`` the fit's query parameters.
    table: str | None = None
    max_samples: int | None = None
    #: Set for asynchronous fits: the worker reports progress under this id.
    job_id: str | None = None

    def check_depth(self) -> None:
        """Refuse JSON nested too deep (400) now, not in the worker: an asynchronous fit is
        checked before it is accepted. A scan of the raw text, far cheaper than parsing."""
        if self.table is None and self.body is not None:
            check_depth(self.body)
        elif self.table is None and self.body_file is not None:
            check_depth(np.fromfile(self.body_file, dtype=np.uint8))
        if self.fields and "options" in self.fields:
            check_depth(self.fields["options"].encode(errors="surrogatepass"))

    def discard_spool(self) -> None:
        for path in (self.body_file, self.file if isinstance(self.file, str) else None):
            if path is not None:
                release_spool(path)


logger = logging.getLogger("calibd")

#: JSON bodies at least this large are spooled to a file as they arrive, not held in memory.
SPOOL_MIN_BYTES = 1 << 20
#: RAM-backed where the system has it (Linux), so that spooling costs no disk I/O.
_SPOOL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
#: Every spool file's name starts with this; ``sweep_spool`` removes only such files.
SPOOL_PREFIX = "calibd-fit-"
#: The lock of each spool file this process holds, by path (see ``new_spool``).
_held: dict[str, int] = {}


def new_spool(suffix: str, directory: str | None = None) -> tuple[int, str]:
    """A new spool file: (a descriptor to write it through, its path).

    The file is locked (``flock``, on a descriptor of its own) from before its first
    byte until ``release_spool``: a lock dies with its process, so a file whose lock
    can be taken belongs to no live process, and ``sweep_spool`` may remove it. The
    lock is taken blocking: a starting process's sweep may hold it for a moment.
    """
    fd, path = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=suffix, dir=directory or _SPOOL_DIR)
    lock = os.open(path, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _held[path] = lock
    return fd, path


def release_spool(path: str) -> None:
    """Remove a spool file, then let go of its lock."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    lock = _held.pop(path, None)
    if lock is not None:
        os.close(lock)


def sweep_spool(directory: str | None = None) -> list[str]:
    """Remove the spool files that processes killed mid-fit left behind (kill -9, out of
    memory), at start. Returns the paths removed.

    Only files named ``calibd-fit-*`` are looked at, and only those whose lock can be
    taken are removed: every live process holds the lock of each file it uses. A file
    created a moment ago is empty until its creator holds the lock (it writes only
    after), so an empty file is left alone for a minute.
    """
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory or _SPOOL_DIR or tempfile.gettempdir()), SPOOL_PREFIX + "*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone, another user's, or a symbolic link
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (info.st_size == 0 and time.time() - info.st_mtime < 60):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:  # BlockingIOError: a live process holds it
            continue
        finally:
            os.close(fd)
    if removed:
        logger.info("removed %d spool files left by stopped processes: %s", len(removed), ", ".join(removed))
    return removed


async def spool_json_body(
    chunks: AsyncIterator[bytes], length: int | None, max_samples: int | None, directory: str | None = None
) -> FitJob:
    """A FitJob for a JSON body read from ``chunks``, the request's ``length`` bytes.

    A large body is written to a file chunk by chunk (each write lets go of the GIL),
    and the worker reads it there: the serving process neither joins it into one 20 MB
    bytes object nor copies that through the process pool's pipe, each a copy that holds
    the GIL for milliseconds while /calibrate requests wait. Smaller bodies, and bodies
    the spool has no room for, are read into memory.
    """
    if length is None or length < SPOOL_MIN_BYTES or not _spool_has_room(length, directory):
        return FitJob(body=b"".join([chunk async for chunk in chunks]), max_samples=max_samples)
    fd, path = new_spool(".json", directory)
    held: list[bytes] = []  # what the spool had no room for after all (another process filled it)
    try:
        async for chunk in chunks:
            if held:
                held.append(chunk)
                continue
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                held = [_read_back(fd), bytes(view)]
    except BaseException:
        os.close(fd)
        release_spool(path)
        raise
    os.close(fd)
    if held:
        release_spool(path)
        return FitJob(body=b"".join(held), max_samples=max_samples)
    return FitJob(body_file=path, max_samples=max_samples)


async def spool_upload(upload: Any, directory: str | None = None) -> str | None:
    """Copy an uploaded file (a starlette ``UploadFile``, already spooled by the form parser)
    to the spool, for the worker to map as it is; None: small, or no room (keep it in memory)."""
    size = upload.size
    if size is None or size < SPOOL_MIN_BYTES or not _spool_has_room(size, directory):
        return None

    def copy() -> str | None:
        fd, path = new_spool(".upload", directory)
        try:
            with os.fdopen(fd, "wb") as out:
                upload.file.seek(0)
                shutil.copyfileobj(upload.file, out, 1 << 20)
        except OSError:
            release_spool(path)
            return None
        except BaseException:
            release_spool(path)
            raise
        return path

    return await asyncio.to_thread(copy)


def _spool_has_room(length: int, directory: str | None = None) -> bool:
    try:
        space = os.statvfs(directory or _SPOOL_DIR or tempfile.gettempdir())
    except OSError:
        return False
    return space.f_bavail * space.f_frsize > 2 * length


def _read_back(fd: int) -> bytes:
    size = os.lseek(fd, 0, os.SEEK_CUR)
    return os.pread(fd, size, 0)


# In a worker process: where progress reports go (set by the pool's initializer).
_progress_queue: Any = None


def run_fit(job: FitJob, progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    """Parse, validate and fit (in a worker). Returns {"result": ...} or {"problem": ...}."""
    if progress is None and job.job_id is not None and _progress_queue is not None:
        queue = _progress_queue

        def progress(fraction: float, stage: str) -> None:
            queue.put((job.job_id, fraction, stage))

    try:
        parse_started = time.perf_counter()
        fit, holdout, to_problem = _parse(job)
        parse_seconds = time.perf_counter() - parse_started
        scores, labels, sample_weight, classes = (
            holdout.pop(key, None) for key in ("scores", "labels", "sample_weight", "classes")
        )
        started = time.perf_counter()
        segments = getattr(fit, "segments", None)
        if segments is not None:
            try:
                segments = check_declaration(segments)
            except CalibrationInputError as error:
                raise input_error(error, ()) from None
        try:
            result = fit_calibrator(
                fit.method, fit.input, fit.options, scores, labels, sample_weight,
                classes=classes, arrays=holdout, max_samples=job.max_samples, progress=progress,
            )
        except CalibrationInputError as error:
            raise to_problem(error) from None
        result.summary["timings"] = {"parse": parse_seconds, **result.summary["timings"]}
        return {
            "result": {
                "name": fit.name,
                "method": fit.method,
                "input_kind": fit.input,
                "promote": fit.promote,
                "n_classes": result.calibrator.n_classes_,
                "classes": result.classes,
                "parameters": result.calibrator.to_dict(),
                "summary": result.summary,
                "holdout_sha256": result.holdout_sha256,
                "n_samples": result.n_samples,
                "fit_seconds": result.fit_seconds,
                "segments": segments,
                "predictor": None if getattr(fit, "predictor", None) is None else fit.predictor.model_dump(),
                "elapsed_seconds": time.perf_counter() - started,
            }
        }
    except Problem as problem:
        return {"problem": {"status": problem.status, "detail": problem.detail, "errors": problem.errors}}


def _parse(job: FitJob) -> tuple[FitRequest, dict[str, Any], Callable[[CalibrationInputError], Problem]]:
    """The fit request, its holdout arrays, and where a core error points, for each form of body."""
    if job.table == "arrow":
        return parse_arrow_fit(job.fields or {}, job.body_file or job.body or b"")
    body = job.body
    if job.body_file is not None:
        with open(job.body_file, "rb") as spooled:
            body = spooled.read()
    if body is None:
        return parse_upload(job.fields or {}, job.file or b"")
    fit = validate(FitRequest, parse_json_object(body))
    holdout = {key: getattr(fit.holdout, key) for key in ("scores", "labels", "sample_weight", "classes")}
    holdout |= fit.holdout.model_extra or {}
    return fit, holdout, lambda error: input_error(error, ("holdout",))


def _ready() -> bool:
    return True


def _init_worker(progress_queue: Any = None) -> None:
    """Run fits at lower CPU priority, report progress to ``progress_queue``, and die with
    the serving process (Linux)."""
    global _progress_queue
    _progress_queue = progress_queue
    # Ctrl-C reaches the whole process group; the serving process stops this worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One BLAS thread: fits are single-threaded by design, and on a busy machine
    # threaded BLAS only contends with the serving process.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    _lower_priority()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's own shutdown stops the workers
        pass
    # A serving process killed while this worker imported (seconds) died before the signal was
    # asked for: the worker has been handed to another parent, and would wait for fits for ever.
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)


def _lower_priority() -> None:
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

    def __init__(self, workers: int, timeout_seconds: float, spool_dir: str | None = None):
        self.workers = workers
        self.timeout_seconds = timeout_seconds
        #: Where large bodies are spooled (None: /dev/shm where writable, else the temporary directory).
        self.spool_dir = spool_dir
        self._executor: ProcessPoolExecutor | None = None
        self._started: Future | None = None
        #: The latest (fraction, stage) reported by each running asynchronous fit.
        self.progress: dict[str, tuple[float, str]] = {}

    def start(self) -> None:
        """Remove the spool files of stopped processes, and start the workers now (in the
        background), so that the first fit does not wait for them."""
        sweep_spool(self.spool_dir)
        if self.workers:
            self._pool()

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=context, initializer=_init_worker, initargs=(queue,)
            )
            self._started = self._executor.submit(_ready)
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

    async def fit(self, job: FitJob) -> dict[str, Any]:
        """The fit's result; raises Problem for bad input, a timeout or a crashed worker."""
        if self.workers == 0:

            def progress(fraction: float, stage: str) -> None:
                if job.job_id is not None:
                    self.progress[job.job_id] = (fraction, stage)

            outcome = await asyncio.wait_for(asyncio.to_thread(run_fit, job, progress), self.timeout_seconds)
        else:
            pool = self._pool()
            try:
                # A worker's start (imports take seconds) does not count against the fit's time.
                await asyncio.wrap_future(self._started)
                future = pool.submit(run_fit, job)
                outcome = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_seconds)
            except asyncio.TimeoutError:
                self._restart()
                raise Problem(
                    503, f"the fit took longer than {self.timeout_seconds:g} s (CALIBD_FIT_TIMEOUT_SECONDS) and was stopped"
                ) from None
            except BrokenProcessPool:
                self._restart()
                raise Problem(503, "the fit worker stopped unexpectedly (out of memory?); try a smaller holdout",
                              headers={"Retry-After": "5"}) from None
        if "problem" in outcome:
            problem = outcome["problem"]
            raise Problem(problem["status"], problem["detail"], problem["errors"])
        return outcome["result"]

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
