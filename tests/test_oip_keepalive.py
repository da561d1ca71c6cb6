"""Transformer mode's HTTP client (app/api/inference/keepalive.py) against a real uvicorn server:
connections kept and bounded, a kept-alive connection the server closed sent on again, chunked
and binary answers read whole, timeouts and refusals raised as such."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from calibd.api.inference.keepalive import Pool
from calibd.predictor_urls import AllowList

from .conftest import free_port

#: The servers of these tests listen on loopback, which calibd allows only when told to.
LOOPBACK = AllowList.parse("127.0.0.1")
MAX_ANSWER = 64 * 1024 * 1024


async def app(scope, receive, send):
    """Echoes the body; /chunked answers in three chunks, /slow after 2 s; says which client port asked."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    port = str(scope["client"][1]).encode()
    if scope["path"] == "/slow":
        await asyncio.sleep(2)
    if scope["path"] == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"inference-header-content-length", b"4")]})
        for part in (b"{\"a\"", b":", b"1}" + body):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 201, "headers": [(b"x-port", port), (b"content-length", str(len(port + b" " + body)).encode())]})
    await send({"type": "http.response.body", "body": port + b" " + body})


@pytest.fixture(scope="module")
def upstream():
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", timeout_keep_alive=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_connections_are_kept_bounded_and_sent_on_again_after_the_server_closes_them(upstream):
    async def run():
        pool = Pool(limit=3, timeout=10, allow=LOOPBACK, max_answer=MAX_ANSWER)
        answers = await asyncio.gather(*(pool.post(f"{upstream}/echo", f"body-{i}".encode()) for i in range(30)))
        await asyncio.sleep(1.5)  # past the server's keep-alive timeout: it closes the idle connections
        late = await pool.post(f"{upstream}/echo", b"late")
        await pool.close()
        return answers, late

    answers, late = asyncio.run(run())
    ports = set()
    for i, (status, length, content) in enumerate(answers):
        port, _, echoed = content.partition(b" ")
        assert (status, length, echoed) == (201, None, f"body-{i}".encode())
        ports.add(port)
    assert len(ports) <= 3  # 30 requests over at most 3 connections
    assert late[0] == 201 and late[2].endswith(b" late")


def test_a_chunked_answer_is_read_whole_with_its_header_length(upstream):
    async def run():
        pool = Pool(limit=2, timeout=10, allow=LOOPBACK, max_answer=MAX_ANSWER)
        try:
            return await pool.post(f"{upstream}/chunked", b"xyz")
        finally:
            await pool.close()

    assert asyncio.run(run()) == (200, "4", b'{"a":1}xyz')


def test_too_slow_is_a_timeout_and_down_is_an_os_error(upstream):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused

    async def run():
        pool = Pool(limit=2, timeout=0.5, allow=LOOPBACK, max_answer=MAX_ANSWER)
        with pytest.raises(TimeoutError):
            await pool.post(f"{upstream}/slow", b"")
        with pytest.raises(OSError):
            await pool.post(f"http://127.0.0.1:{held.getsockname()[1]}/x", b"")
        answer = await pool.post(f"{upstream}/echo", b"after")  # the pool still works
        await pool.close()
        return answer

    try:
        assert asyncio.run(run())[2].endswith(b" after")
    finally:
        held.close()
