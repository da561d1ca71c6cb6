"""An open-loop HTTP load generator, wrk2-style: requests leave on a fixed schedule.

    python benchmarks/_openloop.py URL BODY_FILE AUTHORIZATION RATE SECONDS [CONNECTIONS [TRACE_FILE]]

Request i is due at t0 + i / RATE. It is sent on an idle keep-alive
connection at once, or waits for one; its latency is counted from the time it
was due, not from when it was sent, so a stalled server is charged for every
request that should have gone out meanwhile (no coordinated omission).
Prints one JSON line: requests sent and answered, and latency percentiles in seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from urllib.parse import urlsplit

import numpy as np


class Connection(asyncio.Protocol):
    def __init__(self, pool: Pool):
        self.pool = pool
        self.buffer = bytearray()
        self.due = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, due: float) -> None:
        self.due = due
        self.buffer.clear()
        self.transport.write(self.pool.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        start = head.find(b"content-length:")
        length = int(head[start + 15 : head.find(b"\r\n", start) if head.find(b"\r\n", start) > 0 else None]) if start >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        ok = head.startswith(b"http/1.1 2")
        self.pool.done(self, time.perf_counter() - self.due, ok)

    def connection_lost(self, exc) -> None:
        self.pool.lost += 1


class Pool:
    def __init__(self, request: bytes):
        self.request = request
        self.idle: deque[Connection] = deque()
        self.waiting: deque[float] = deque()
        self.latencies: list[float] = []
        self.due_times: list[float] = []
        self.failures = 0
        self.lost = 0
        self.sent = 0

    def submit(self, due: float) -> None:
        self.sent += 1
        if self.idle:
            self.idle.popleft().send(due)
        else:
            self.waiting.append(due)

    def done(self, connection: Connection, latency: float, ok: bool) -> None:
        self.latencies.append(latency)
        self.due_times.append(connection.due)
        if not ok:
            self.failures += 1
        if self.waiting:
            connection.send(self.waiting.popleft())
        else:
            self.idle.append(connection)


async def run(url: str, body: bytes, authorization: str, rate: float, seconds: float, connections: int,
              trace: str | None = None) -> dict:
    parts = urlsplit(url)
    request = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
        f"Content-Type: application/json\r\nAuthorization: {authorization}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    pool = Pool(request)
    loop = asyncio.get_running_loop()
    for _ in range(connections):
        _, protocol = await loop.create_connection(lambda: Connection(pool), parts.hostname, parts.port)
        pool.idle.append(protocol)
    interval = 1.0 / rate
    total = int(rate * seconds)
    t0 = time.perf_counter() + 0.05
    i = 0
    while i < total:
        now = time.perf_counter()
        while i < total and t0 + i * interval <= now:
            pool.submit(t0 + i * interval)
            i += 1
        if i < total:
            await asyncio.sleep(max(0.0, t0 + i * interval - time.perf_counter()))
    deadline = time.perf_counter() + 30
    while len(pool.latencies) < pool.sent and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    latencies = np.array(pool.latencies)
    q = np.quantile(latencies, [0.5, 0.9, 0.99, 0.999]) if latencies.size else [float("nan")] * 4
    if trace:  # (due time as Unix time, latency) of every request, for lining up with other events
        offset = time.time() - time.perf_counter()
        with open(trace, "w") as f:
            f.writelines(f"{due + offset:.6f} {latency:.6f}\n" for due, latency in zip(pool.due_times, pool.latencies))
    return {
        "rate": rate, "sent": pool.sent, "answered": int(latencies.size), "failures": pool.failures,
        "elapsed": elapsed, "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "p999": float(q[3]),
        "max": float(latencies.max()) if latencies.size else float("nan"),
    }


def main() -> None:
    url, body_file, authorization, rate, seconds = sys.argv[1:6]
    connections = int(sys.argv[6]) if len(sys.argv) > 6 else 32
    trace = sys.argv[7] if len(sys.argv) > 7 else None
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with open(body_file, "rb") as f:
        body = f.read()
    result = runner(run(url, body, authorization, float(rate), float(seconds), connections, trace))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
