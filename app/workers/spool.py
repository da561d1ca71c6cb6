"""Spool files: large fit bodies wait in files for a worker process, not in memory.

A JSON body of ``SPOOL_MIN_BYTES`` or more, or an uploaded Parquet file, is written to a file
(in /dev/shm where writable) as it arrives; the worker reads it there, and ``FitJob.discard_spool``
removes it. Each file is locked by the process that holds it, so that ``sweep_spool`` at start
removes only the files of processes that died mid-fit.
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("calibd")


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
    #: CALIBD_MAX_DECODED_BYTES: the most an uploaded table or archive may take decompressed.
    max_decoded_bytes: int | None = None
    #: Set for asynchronous fits: the worker reports progress under this id.
    job_id: str | None = None

    def discard_spool(self) -> None:
        for path in (self.body_file, self.file if isinstance(self.file, str) else None):
            if path is not None:
                release_spool(path)


#: JSON bodies at least this large are spooled to a file as they arrive, not held in memory.
SPOOL_MIN_BYTES = 1 << 20
#: RAM-backed where the system has it (Linux), so that spooling costs no disk I/O.
SPOOL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
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
    fd, path = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=suffix, dir=directory or SPOOL_DIR)
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
    for path in glob.glob(os.path.join(glob.escape(directory or SPOOL_DIR or tempfile.gettempdir()), SPOOL_PREFIX + "*")):
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
    if length is None or length < SPOOL_MIN_BYTES or not spool_has_room(length, directory):
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
                held = [read_back(fd), bytes(view)]
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
    if size is None or size < SPOOL_MIN_BYTES or not spool_has_room(size, directory):
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


def spool_has_room(length: int, directory: str | None = None) -> bool:
    try:
        space = os.statvfs(directory or SPOOL_DIR or tempfile.gettempdir())
    except OSError:
        return False
    return space.f_bavail * space.f_frsize > 2 * length


def read_back(fd: int) -> bytes:
    size = os.lseek(fd, 0, os.SEEK_CUR)
    return os.pread(fd, size, 0)
