"""Read timeouts of ``calibd serve``, with raw sockets: half-sent headers get a 408 and are closed,
a body shorter than its Content-Length is abandoned (its spool file removed), and a client that
keeps sending is left alone."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .processes import free_port, stop, wait_ready

HEADER_TIMEOUT = BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[int, Path]]:
    folder = tmp_path_factory.mktemp("timeouts")
    port = free_port()
    env = dict(
        os.environ, CALIBD_DATABASE_URL=f"sqlite:///{folder / 'calibd.db'}", CALIBD_SPOOL_DIR=str(folder),
        CALIBD_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT), CALIBD_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
    )
    log = open(folder / "calibd.log", "wb")
    server = subprocess.Popen([str(Path(sys.executable).with_name("calibd")), "serve", "--port", str(port)],
                              env=env, stdout=log, stderr=log)
    try:
        wait_ready(server, f"http://127.0.0.1:{port}/healthz", 90, "calibd serve", lambda: (folder / "calibd.log").read_text())
        yield port, folder
    finally:
        stop(server)
        log.close()


def connect(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(10)
    if data:
        sock.sendall(data)
    return sock


def until_closed(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closes the connection, and what it sent meanwhile."""
    started, received = time.monotonic(), b""
    with sock:
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return time.monotonic() - started, received


def one_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (head and Content-Length body): the server may send them in separate packets."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the response's head ended: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed before the response's body ended"
        body += chunk
    assert len(body) == length, "more bytes than the response's Content-Length"
    return head + b"\r\n\r\n" + body


def test_half_sent_headers_and_silent_connections_get_408_and_are_closed(served):
    port, _ = served
    opened = time.monotonic()
    half = [connect(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(10)]
    silent = [connect(port, b"") for _ in range(10)]
    for sock in half + silent:
        waited, received = until_closed(sock)
        assert received.startswith(b"HTTP/1.1 408 ") and b"connection: close" in received.lower()
    # each was closed past its deadline, and well before the sockets' own 10 s timeout
    assert HEADER_TIMEOUT <= time.monotonic() - opened < HEADER_TIMEOUT + 3


def test_headers_trickled_slower_than_the_deadline_are_cut_off(served):
    port, _ = served
    sock = connect(port, b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    try:
        for _ in range(20):  # a byte every 0.2 s: never idle, but never done
            time.sleep(0.2)
            sock.sendall(b"X")
    except (BrokenPipeError, ConnectionResetError):
        pass
    waited, received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < HEADER_TIMEOUT + 3


def test_a_body_shorter_than_its_length_is_abandoned_and_its_spool_removed(served):
    port, folder = served
    head = (b"POST /calibrators HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 4000000\r\n\r\n")
    socks = [connect(port, head + b" " * 1_500_000) for _ in range(3)]  # past the spool's 1 MB: written to files
    time.sleep(0.3)
    assert len(glob.glob(str(folder / "calibd-fit-*"))) == 3
    for sock in socks:
        waited, received = until_closed(sock)
        assert waited < BODY_TIMEOUT + 3 and b"HTTP/1.1 2" not in received
    deadline = time.monotonic() + 5
    while glob.glob(str(folder / "calibd-fit-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert glob.glob(str(folder / "calibd-fit-*")) == []


def test_a_slow_but_steady_body_and_a_keep_alive_connection_are_served(served):
    port, _ = served
    body = b'{"probabilities": [0.2, 0.8, 0.6], "labels": [0, 1, 1]}'
    sock = connect(port, b"POST /evaluate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
    with sock:
        for start in range(0, len(body), 4):  # 14 pieces, 0.25 s apart: 3.5 s in all, never 1 s idle
            time.sleep(0.25)
            sock.sendall(body[start:start + 4])
        assert one_response(sock).startswith(b"HTTP/1.1 200 ")
        # the same connection, idle less than the deadline, then another request
        time.sleep(HEADER_TIMEOUT / 2)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert one_response(sock).startswith(b"HTTP/1.1 200 ")
