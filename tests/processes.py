"""Servers in child processes on loopback ports, as the tests and the benchmarks run them: a free
port, the wait until one answers, and its stop. (benchmarks/ imports this module too.)"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from collections.abc import Callable

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(process: subprocess.Popen, url: str, timeout: float, what: str, log: Callable[[], str] = lambda: "") -> None:
    """Poll GET ``url`` until it answers 200. Raises RuntimeError, with the end of ``log()``, if the
    process exits first or ``timeout`` seconds pass (the process is then stopped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log()[-3000:]}")
        if time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"{what} did not answer {url} within {timeout:g} s:\n{log()[-3000:]}")
        time.sleep(0.1)


def stop(process: subprocess.Popen | None, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``timeout`` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux: /proc/<pid>/task/<tid>/children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            pass
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
