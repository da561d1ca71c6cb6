"""/calibrate's CPU per request by layer, against the raw ASGI echo, in process through uvicorn's own protocol.

    .venv/bin/python benchmarks/layer_profile.py [--batches 30] [--batch 200] [--workloads 1a,1b,1c,1d]

No sockets and no load generator: each request's bytes are handed to
uvicorn's ``HttpToolsProtocol.data_received`` (the httptools parser, the
request-response cycle, the ASGI task on a uvloop loop, as ``calibd serve``
runs it) over an in-memory transport that collects the answer, one request
at a time. The same protocol serves the raw ASGI echo (benchmarks/echo_app.py
--raw) and calibd (``create_app``: SQLite, a key required, the JSON access
log on and written to /dev/null by its background writer, request metrics
on), so what is left is what each app costs on top of the server, in CPU,
free of the kernel's and wrk's share and of most of the noise of a busy
machine (process CPU time, medians over interleaved batches).

Three measurements per workload, batches of each interleaved:
  * total: process CPU per request (all threads: the log writer's share too),
    with no instrumentation; for the raw echo, for uvicorn with an app that
    answers a fixed body without reading it (the server's floor), and calibd;
  * layers: calibd again with each layer's function wrapped in a timer that
    keeps exclusive time (a stack: a layer's time less that of the layers it
    calls); uvicorn's share is the request's time less the app's, plus the
    app's calls to uvicorn's ``send`` and ``receive``. The wrappers' own cost
    is the instrumented total less the plain total, shown as its own row;
  * without: calibd with one layer replaced by a no-op (the access log, the
    request metrics, the key check), whose plain-total difference is that
    layer's whole cost (the access log's includes the writer thread's
    formatting and write, which no timer in the request sees).
"""

from __future__ import annotations

import argparse
import importlib
import asyncio
import collections
import gc
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import uvloop  # noqa: E402
from uvicorn.config import Config  # noqa: E402
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

import calibrate_throughput as ct  # noqa: E402
import echo_app  # noqa: E402
from _harness import machine, write_results  # noqa: E402

KEY = "calibd_bench0001_" + "k" * 32


class Transport:
    """The in-memory side of the connection: collects what uvicorn writes, and says when an answer is whole."""

    def __init__(self):
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length: ")
        length = int(head[at + 16:head.find(b"\r\n", at)]) if at >= 0 else 0
        if len(self.buffer) >= end + 4 + length:
            answer = bytes(self.buffer[:end + 4 + length])
            del self.buffer[:end + 4 + length]
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(answer)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol) -> None:
        pass


class Connection:
    """One keep-alive connection to ``app`` through uvicorn's httptools protocol."""

    def __init__(self, app, loop):
        config = Config(app=app, http="httptools", loop="none", lifespan="off", log_config=None, access_log=False)
        config.load()
        self.transport = Transport()
        self.protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        self.protocol.connection_made(self.transport)
        self.loop = loop

    async def request(self, raw: bytes) -> bytes:
        waiter = self.transport.waiter = self.loop.create_future()
        self.protocol.data_received(raw)
        return await waiter


def http_request(path: str, body: bytes, key: str | None = KEY) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1:8000", "User-Agent: wrk", "Content-Type: application/json",
            f"Content-Length: {len(body)}"]
    if key:
        head.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def status_of(answer: bytes) -> int:
    return int(answer[9:12])


def body_of(answer: bytes) -> bytes:
    return answer[answer.find(b"\r\n\r\n") + 4:]


_FIXED = b'{"calibrator":"iso","version":1,"probabilities":[0.5]}'


async def fixed_app(scope, receive, send) -> None:
    """uvicorn's floor: answers a fixed body, reading nothing (the body was parsed by httptools all the same)."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(_FIXED)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": _FIXED})


# -- layers: exclusive time of the functions that make up a /calibrate request --------------------
class Layers:
    """Timers with exclusive time: each wrapped call adds its time less its wrapped callees' to its layer."""

    def __init__(self):
        self.time: collections.Counter = collections.Counter()
        self._children = [0.0]

    def wrap_async(self, layer: str, function):
        children, totals, clock = self._children, self.time, time.perf_counter

        async def timed(*args, **kwargs):
            started = clock()
            children.append(0.0)
            try:
                return await function(*args, **kwargs)
            finally:
                elapsed = clock() - started
                totals[layer] += elapsed - children.pop()
                children[-1] += elapsed

        return timed

    def wrap(self, layer: str, function):
        children, totals, clock = self._children, self.time, time.perf_counter

        def timed(*args, **kwargs):
            started = clock()
            children.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = clock() - started
                totals[layer] += elapsed - children.pop()
                children[-1] += elapsed

        return timed


UVICORN = "uvicorn: httptools parse, request-response cycle, event loop (the request less the app's time)"
LAYER_ORDER = [
    UVICORN,
    "uvicorn: the app's send and receive calls",
    "Edge: request id, header scan, send wrapper, shortcut lookup",
    "access log (queueing the line; the writer's formatting: see 'without')",
    "request metrics (duration histogram, two counters)",
    "auth (bearer token, key check)",
    "media type, header scan of the endpoint",
    "body read (receive loop)",
    "body parsing (orjson)",
    "envelope checks (_plain, _envelope)",
    "calibrator lookup, batch checks (calibrate_batch)",
    "calibration (the compiled kernel or predict_details)",
    "response dict, orjson encoding",
    "response start and body messages (send_json)",
    "endpoint's own lines (calibrate)",
]


@contextmanager
def patched(module, **replacements):
    saved = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


class OrjsonShim:
    """``orjson`` as the router sees it, with ``dumps`` timed."""

    def __init__(self, dumps):
        self.dumps = dumps
        self.loads = orjson.loads
        self.OPT_SERIALIZE_NUMPY = orjson.OPT_SERIALIZE_NUMPY
        self.JSONDecodeError = orjson.JSONDecodeError


@contextmanager
def instrumented(app, layers: Layers, calibrators):
    """While open, each layer of calibd's ``app`` is timed in ``layers``; yields the ASGI app to serve."""
    from calibd.api import edge
    router = importlib.import_module("calibd.api.calibrate.router")
    from calibd.api.edge import EdgeFirst

    L, names = layers, LAYER_ORDER
    routes = [route for _, route in edge._asgi_routes(app.router.routes) if route.endpoint.asgi is router.calibrate]
    assert routes, "no /calibrate route to time"
    with ExitStack() as stack:
        stack.enter_context(patched(
            edge, access_line=L.wrap(names[3], edge.access_line), observe_duration=L.wrap(names[4], edge.observe_duration),
            authorize=L.wrap(names[5], edge.authorize), bearer_token=L.wrap(names[5], edge.bearer_token),
            require_json=L.wrap(names[6], edge.require_json), read_body=L.wrap_async(names[7], edge.read_body),
            parse_json_object=L.wrap(names[8], edge.parse_json_object)))
        stack.enter_context(patched(
            router, json_request=L.wrap_async(names[6], router.json_request),
            count_calibrated=L.wrap(names[4], router.count_calibrated), _plain=L.wrap(names[9], router._plain),
            _envelope=L.wrap(names[9], router._envelope), calibrate_batch=L.wrap_async(names[10], router.calibrate_batch),
            orjson=OrjsonShim(L.wrap(names[12], orjson.dumps)), send_json=L.wrap_async(names[13], router.send_json)))
        stack.enter_context(patched(EdgeFirst, __call__=L.wrap_async(names[2], EdgeFirst.__call__)))
        for route in routes:
            stack.enter_context(patched(route.endpoint, asgi=L.wrap_async(names[14], router.calibrate)))
        for calibrator in calibrators:  # instance attributes over the class's methods, removed after
            calibrator.predict_compiled = L.wrap(names[11], type(calibrator).predict_compiled.__get__(calibrator))
            calibrator.predict_details = L.wrap(names[11], type(calibrator).predict_details.__get__(calibrator))
        try:
            async def outer(scope, receive, send):
                await app(scope, L.wrap_async(names[1], receive), L.wrap_async(names[1], send))

            yield outer
        finally:
            for calibrator in calibrators:
                del calibrator.predict_compiled, calibrator.predict_details


WITHOUT = ("access log", "request metrics", "auth", "the garbage collector")


# -- the runs -----------------------------------------------------------------------------------------
def without(layer: str):
    """calibd with ``layer`` made a no-op (a context manager)."""
    from calibd.api import edge
    router = importlib.import_module("calibd.api.calibrate.router")

    if layer == "access log":
        return patched(edge, access_line=lambda *args: None)
    if layer == "request metrics":
        return ExitStack() if False else _both(patched(edge, observe_duration=lambda *args: None),
                                               patched(router, count_calibrated=lambda *args: None))
    if layer == "auth":
        return patched(edge, authorize=lambda *args: None)
    if layer == "the garbage collector":
        return _gc_off()
    raise ValueError(layer)


@contextmanager
def _gc_off():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextmanager
def _both(first, second):
    with first, second:
        yield


async def batch(connection: Connection, raw: bytes, n: int, walls: list | None = None) -> tuple[float, float]:
    """(process CPU, wall) seconds per request over ``n`` requests; each request's wall time added to ``walls``."""
    clock = time.perf_counter
    cpu, wall = time.process_time(), clock()
    for _ in range(n):
        started = clock()
        await connection.request(raw)
        if walls is not None:
            walls.append(clock() - started)
    return (time.process_time() - cpu) / n, (clock() - wall) / n


async def timed_batch(connection: Connection, raw: bytes, n: int, layers: Layers, out: dict) -> tuple[float, float, bytes]:
    """``batch`` for an app whose layers are timed: each request's layers, and the rest as uvicorn's, added to ``out``."""
    clock = time.perf_counter
    cpu, wall = time.process_time(), clock()
    for _ in range(n):
        layers.time.clear()
        started = clock()
        answer = await connection.request(raw)
        elapsed = clock() - started
        app_time = 0.0
        for layer, seconds in layers.time.items():
            out[layer].append(seconds)
            app_time += seconds
        out[UVICORN].append(elapsed - app_time)
        out["request, timed"].append(elapsed)
    return (time.process_time() - cpu) / n, (clock() - wall) / n, answer


async def measure(args) -> dict:
    from calibd.config import Settings
    from calibd.main import create_app

    loop = asyncio.get_running_loop()
    folder = Path(tempfile.mkdtemp(prefix="layer-profile-"))
    settings = Settings(database_url=f"sqlite:///{folder / 'calibd.db'}", bootstrap_admin_key=KEY, fit_workers=0,
                        spool_dir=str(folder / "spool"))
    from calibd.storage import migrate
    from calibd.storage.db import make_engine

    engine = make_engine(settings.database_url)
    migrate.upgrade(engine)
    engine.dispose()
    app = create_app(settings)
    results: dict = {}
    async with app.router.lifespan_context(app):
        calibd = Connection(app, loop)
        rng = np.random.default_rng(1)
        s = rng.random(50_000)
        y = (rng.random(s.shape[0]) < s**1.4).astype(int)
        z = rng.normal(0.0, 2.0, size=(5_000, 10))
        p = np.exp(z / 1.7)
        p /= p.sum(axis=1, keepdims=True)
        labels = np.array([rng.choice(10, p=row) for row in p])
        for body in ({"name": "iso", "method": "isotonic", "holdout": {"scores": s.tolist(), "labels": y.tolist()}},
                     {"name": "temp10", "method": "temperature", "input": "logit",
                      "holdout": {"scores": z.tolist(), "labels": labels.tolist()}}):
            answer = await calibd.request(http_request("/calibrators", orjson.dumps(body)))
            assert status_of(answer) in (200, 201), answer[:300]
        payloads = ct.bodies(np.random.default_rng(0))
        store = app.state.services.store
        calibrators = [store.get(name, None).calibrator for name in ("iso", "temp10")]
        echo = Connection(echo_app.raw_app, loop)
        floor = Connection(fixed_app, loop)
        labels_of = {key: label for key, label, *_ in ct.WORKLOADS}
        for key in args.workloads.split(","):
            raw = http_request("/calibrate", payloads[key])
            echo_raw = http_request("/echo", payloads[key], key=None)
            answer = await calibd.request(raw)
            assert status_of(answer) == 200, answer[:300]
            expected = orjson.loads(body_of(answer))["probabilities"]
            n = max(5, args.batch // (20 if key == "1c" else 1))
            runs = collections.defaultdict(list)
            layer_runs = collections.defaultdict(list)
            echo_layers = collections.defaultdict(list)
            for _ in range(3):  # warm
                await batch(calibd, raw, n)
                await batch(echo, echo_raw, n)
            for _ in range(args.batches):
                runs["uvicorn floor (fixed answer, body unread)"].append(await batch(floor, echo_raw, n))
                runs["raw ASGI echo"].append(await batch(echo, echo_raw, n, echo_layers["request, plain"]))
                runs["calibd"].append(await batch(calibd, raw, n, layer_runs["request, plain"]))
                for layer in WITHOUT:
                    with without(layer):
                        runs[f"calibd without {layer}"].append(await batch(calibd, raw, n))
                layers = Layers()
                with instrumented(app, layers, calibrators) as timed:
                    cpu, wall, answer = await timed_batch(Connection(timed, loop), raw, n, layers, layer_runs)
                runs["calibd, layers timed"].append((cpu, wall))
                # the raw echo, timed the same way: its app (exclusive), uvicorn's send and receive, the rest
                layers = Layers()

                async def timed_echo(scope, receive, send, app=layers.wrap_async("raw echo: the app", echo_app.raw_app)):
                    await app(scope, layers.wrap_async(LAYER_ORDER[1], receive), layers.wrap_async(LAYER_ORDER[1], send))

                await timed_batch(Connection(timed_echo, loop), echo_raw, n, layers, echo_layers)
            assert orjson.loads(body_of(answer))["probabilities"] == expected  # the timed app answers the same
            results[key] = {
                "label": labels_of[key],
                "totals": {name: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
                           for name, v in runs.items()},
                # each layer's median over requests: a request the machine preempted inflates one layer of one
                # request, which the median leaves out
                "layers": {name: statistics.median(v + [0.0] * (len(layer_runs[UVICORN]) - len(v)))
                           for name, v in layer_runs.items()},
                "echo_layers": {name: statistics.median(v) for name, v in echo_layers.items()},
            }
            print(f"  {key}: calibd {results[key]['totals']['calibd'][0] * 1e6:.1f} us, raw echo "
                  f"{results[key]['totals']['raw ASGI echo'][0] * 1e6:.1f} us CPU", file=sys.stderr, flush=True)
    return results


def report(results: dict, args, started_machine: str) -> list[str]:
    keys = list(results)
    head = "| | " + " | ".join(results[k]["label"] for k in keys) + " |"
    rule = "|---|" + "---:|" * len(keys)
    us = lambda seconds: f"{seconds * 1e6:,.1f}"  # noqa: E731
    lines = [
        "## /calibrate's CPU per request by layer, against the raw ASGI echo (in process, through uvicorn's protocol)",
        "",
        f"`benchmarks/layer_profile.py --batches {args.batches} --batch {args.batch}`; {started_machine}. "
        "Each request's bytes go to uvicorn's own `HttpToolsProtocol` (httptools, uvloop, the request-response cycle, "
        "the ASGI task) over an in-memory transport, one request at a time: no sockets, no wrk, so what differs is "
        "what each app costs on top of the server. calibd: `create_app` on SQLite, a key required, the JSON access "
        "log on (its writer thread writing to /dev/null), request metrics on. Microseconds per request, medians over "
        "interleaved batches (10,000 scores: batches a twentieth as long).",
        "",
        "### Totals (process CPU, all threads, no instrumentation)",
        "",
        head, rule,
    ]
    totals = ["uvicorn floor (fixed answer, body unread)", "raw ASGI echo", "calibd",
              *(f"calibd without {layer}" for layer in WITHOUT)]
    for name in totals:
        lines.append(f"| {name} | " + " | ".join(us(results[k]["totals"][name][0]) for k in keys) + " |")
    lines.append("| **raw echo / calibd** (the in-process counterpart of the throughput ratio) | " + " | ".join(
        f"**{results[k]['totals']['raw ASGI echo'][0] / results[k]['totals']['calibd'][0]:.3f}**" for k in keys) + " |")
    for layer in WITHOUT:
        lines.append(f"| whole cost of the {layer} (calibd less calibd without it) | " + " | ".join(
            us(results[k]["totals"]["calibd"][0] - results[k]["totals"][f"calibd without {layer}"][0]) for k in keys) + " |")
    lines.append("| calibd over the raw echo | " + " | ".join(
        us(results[k]["totals"]["calibd"][0] - results[k]["totals"]["raw ASGI echo"][0]) for k in keys) + " |")
    lines += ["", "### calibd by layer (a timer on each layer, exclusive of the layers it calls; medians over requests, microseconds)", "",
              head, rule]
    for layer in LAYER_ORDER:
        lines.append(f"| {layer} | " + " | ".join(us(results[k]["layers"].get(layer, 0.0)) for k in keys) + " |")
    lines.append("| **calibd's layers, summed** | " + " | ".join(
        f"**{us(sum(results[k]['layers'].get(layer, 0.0) for layer in LAYER_ORDER[2:]))}**" for k in keys) + " |")
    lines.append("| one request, timed (median) | " + " | ".join(us(results[k]["layers"]["request, timed"]) for k in keys) + " |")
    lines.append("| one request, no timers (median) | " + " | ".join(us(results[k]["layers"]["request, plain"]) for k in keys) + " |")
    lines += ["", "The raw echo, timed alike:", "", head, rule]
    for name in (UVICORN, LAYER_ORDER[1], "raw echo: the app", "request, timed", "request, plain"):
        lines.append(f"| {name} | " + " | ".join(us(results[k]["echo_layers"][name]) for k in keys) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=30, help="interleaved batches per variant (default 30)")
    parser.add_argument("--batch", type=int, default=200, help="requests per batch (default 200)")
    parser.add_argument("--workloads", default="1a,1b,1c,1d")
    parser.add_argument("--no-write", action="store_true", help="print only, leave results/ alone")
    args = parser.parse_args(argv)
    started_machine = machine()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)  # the access log's destination
    try:
        results = uvloop.run(measure(args))
    finally:
        os.dup2(saved, 2)
    lines = report(results, args, started_machine)
    notes = ROOT / "benchmarks" / "reference" / "layer_profile_notes.md"
    if notes.exists():  # the reading of a run, kept with the figures it quotes
        lines += ["", notes.read_text().rstrip()]
    if not args.no_write:
        write_results("layer_profile", "\n".join(lines), [])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
