"""Spool files a killed process left behind are removed at the next start; nothing else is.

Large fit bodies wait for their worker in spool files (``calibd-fit-*`` in
/dev/shm, or CALIBD_SPOOL_DIR). Each process holds an ``flock`` on every
spool file it uses, and the kernel drops it when the process dies; at start,
a process removes the files whose lock it can take.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from calibd.workers.spool import SPOOL_MIN_BYTES, new_spool, release_spool, sweep_spool

from .processes import children, running
from .reliability.harness import CalibdProcess


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def spools(folder: Path) -> list[Path]:
    return sorted(folder.glob("calibd-fit-*"))


def test_a_killed_process_spool_file_is_removed_at_the_next_start(fresh_database, tmp_path):
    folder = tmp_path / "spool"
    folder.mkdir()
    # Neither calibd's nor unheld: a file of another program, and a spool file a live process holds.
    foreign = folder / "other-program.json"
    foreign.write_bytes(b"{}" * 1000)
    held = folder / "calibd-fit-held.json"
    held.write_bytes(b"{}" * 1000)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)", str(held)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        server = CalibdProcess(fresh_database, tmp_path, name="spool", spool_dir=str(folder)).start()
        try:
            # A fit body of 3 MB, of which 2 MB arrive: the server spools it as it streams in.
            declared = 3 * SPOOL_MIN_BYTES
            connection = socket.create_connection(("127.0.0.1", server.port))
            connection.sendall(
                f"POST /calibrators?async=true HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n".encode() + b'{"name": "spooled", "method": "platt", "holdout": {"scores": ['
                + b"0.5, " * (2 * SPOOL_MIN_BYTES // 5)
            )
            wait_for(lambda: any(p != held and p.stat().st_size > SPOOL_MIN_BYTES for p in spools(folder)))
            left = [p for p in spools(folder) if p != held]
            assert len(left) == 1 and left[0].suffix == ".json", left
            workers = children(server.pid)  # the fit workers (perhaps still importing) and their resource tracker
            assert workers
            server.kill()  # SIGKILL: no cleanup runs
            connection.close()
            assert left[0].exists(), "the kill should have left the spool file behind"
            # The dead process's workers end too, even those it started moments before: none waits for ever.
            wait_for(lambda: not any(running(pid) for pid in workers), timeout=60)
            server.start()
            # The new process removed the dead one's file, and only that.
            assert not left[0].exists()
            assert held.exists() and foreign.exists()
            # Log lines are written by a background thread: the line may follow the first answer.
            wait_for(lambda: "removed 1 spool files left by stopped processes" in server.log_tail(200), timeout=10)
        finally:
            server.stop()
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the held file goes at the next sweep too.
    assert sweep_spool(str(folder)) == [str(held)] and foreign.exists()


def test_sweep_keeps_files_in_use_and_files_being_created(tmp_path):
    fd, path = new_spool(".json", str(tmp_path))
    os.write(fd, b"[1, 2, 3]")
    os.close(fd)
    fresh = tmp_path / "calibd-fit-fresh.json"
    fresh.touch()  # as mkstemp leaves it, before its creator locks it and writes
    try:
        assert sweep_spool(str(tmp_path)) == []  # held by this process; empty and new
        assert Path(path).exists() and fresh.exists()
        old = time.time() - 120
        os.utime(fresh, (old, old))
        assert sweep_spool(str(tmp_path)) == [str(fresh)]  # empty, but a minute old: abandoned
    finally:
        release_spool(path)
    assert not Path(path).exists()
    os.symlink(tmp_path / "elsewhere", tmp_path / "calibd-fit-link.json")
    assert sweep_spool(str(tmp_path)) == []
