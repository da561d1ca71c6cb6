"""Where /calibrate's time goes beyond the baseline's: a cost breakdown, and a py-spy profile.

    .venv/bin/python benchmarks/calibrate_profile.py [--requests 3000] [--no-py-spy]

(1) In process, through the whole ASGI app (middleware, routing, auth) but
    without sockets: routes that each do one more step of /calibrate's work than
    the last, all inserted at the front of the route table (matching a route far
    down the table costs tens of microseconds by itself), timed request by
    request in interleaved order, median per route:
      A  parse, check the envelope, answer the scores as they were parsed;
      B  + make the scores a float64 array (struct, for more than 256 scores or
         rows), answered: the throughput benchmark's baseline route;
      C  + find the calibrator in memory and count the request (two counters);
      D  + calibrating as /calibrate does: the compiled kernel on the parsed list
         (app/calibration/kernels.py; B's array is then not made), else
         predict_details on B's array (validation and calibration);
      E  + answer the probabilities instead of the scores: /calibrate.
    The increments are what each step costs per request here; E - B is what
    calibrating costs over the HTTP + JSON floor the baseline measures.
    The access line is formatted and written (to /dev/null) in the request's
    own thread here. The server writes it from a background thread, which in a
    loop that never waits on a socket would rarely get the GIL, and while it
    waited every GIL-releasing numpy call would pay to wake it (10-20 us).
    Then the temperature workload's predict, call by call: the five numpy
    calls of TemperatureCalibrator's numpy path (their result checked against
    it), each timed in a loop of its own (warm) and once after each request
    through the app, as a served request meets them; and beside them the
    compiled kernel on the JSON list, which /calibrate calls instead.
(2) The GIL hand-off tax, each figure in a fresh interpreter: the median time
    of one numpy call (np.add on 1,000 floats, which releases the GIL, and on
    400, which does not) after ~30 us of Python work, alone and beside a thread
    that sleeps in a loop, as the server's log writer does. In CPython 3.11 a
    thread that wakes waits for the GIL, and every release by the busy thread
    wakes it again until it wins one; each such release costs the busy thread.
(3) With py-spy (``--py-spy PATH``, else on PATH or /tmp/prof-venv/bin/py-spy;
    not a calibd dependency: ``pip install py-spy`` in a scratch virtualenv), a
    sampling profile of a real `calibd serve` under wrk on the 10,000-score and
    the temperature workloads, /calibrate and the baseline: the functions with
    the most samples.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import logging
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from fastapi import Request  # at module level: FastAPI resolves the routes' annotations here

os.environ["CALIBD_BENCHMARK_ROUTES"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _harness import Server, machine, run_wrk, write_results  # noqa: E402
import calibrate_throughput as ct  # noqa: E402

STEPS = [
    ("A", "parse, envelope, answer the parsed scores"),
    ("B", "+ scores to a float64 array (the baseline route)"),
    ("C", "+ calibrator from memory, two counters"),
    ("D", "+ calibration as /calibrate does it (the kernel on the list, no array; else predict_details on the array)"),
    ("E", "+ answer the probabilities (all /calibrate does)"),
]


def step_route(level: int):
    from calibd.api.bodies import float_array, parse_json_object, require_json
    from calibd.api.state import services
    from calibd.api.validation import json_response

    router = importlib.import_module("calibd.api.calibrate.router")

    async def route(request: Request):
        require_json(request.headers)
        data = parse_json_object(await request.body())
        name, version, scores, ids, arrays = router._envelope(data)
        if level >= 2:
            loaded = services(request).store.get(name, version)
            requests, scored = router._counters.get(name) or router._count(name)
            requests.inc()
            scored.inc(len(scores))
        # From D on, as /calibrate: a compiled kernel reads the list itself, and no array is made.
        probabilities = loaded.calibrator.predict_compiled(scores) if level >= 3 else None
        values = float_array(scores) if level >= 1 and probabilities is None else None
        parsed = scores if values is None else values
        if level >= 3 and probabilities is None:
            probabilities, extras = loaded.calibrator.predict_details(parsed)
        if level >= 4:
            return json_response({"calibrator": name, "version": loaded.version, "probabilities": probabilities})
        return json_response({"calibrator": name, "version": 1, "probabilities": parsed})

    return route


def scope_for(path: str, body: bytes, key: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {key}".encode()), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }


async def call(app, path: str, body: bytes, key: str) -> tuple[int, bytes]:
    sent = False
    status, chunks = 0, []

    async def receive():
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope_for(path, body, key), receive, send)
    return status, b"".join(chunks)


async def breakdown(requests: int) -> dict[str, dict[str, float]]:
    from fastapi.routing import APIRoute

    from calibd.api.auth import REQUIRE_CALIBRATE
    from calibd.config import Settings
    from calibd.main import create_app
    from calibd.storage import migrate
    from calibd.storage.db import make_engine

    folder = Path(tempfile.mkdtemp(prefix="calibd-profile-"))
    url = f"sqlite:///{folder / 'calibd.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    key = f"calibd_prof{secrets.token_hex(4)}_{secrets.token_hex(16)}"
    app = create_app(Settings(database_url=url, bootstrap_admin_key=key, fit_workers=0))
    # The access line is formatted and written to /dev/null in the request's thread (see the docstring).
    devnull = logging.StreamHandler(open(os.devnull, "w"))
    devnull.setFormatter(logging.getLogger("calibd").handlers[0].formatter)
    for logger in ("calibd", "calibd.access"):
        if logging.getLogger(logger).handlers:
            logging.getLogger(logger).handlers = [devnull]
    for level in range(5):
        route = APIRoute(f"/profile/step{level}", step_route(level), methods=["POST"], dependencies=[REQUIRE_CALIBRATE])
        app.router.routes.insert(0, route)
    results: dict[str, dict[str, float]] = {}
    async with app.router.lifespan_context(app):
        rng = np.random.default_rng(1)
        s = rng.random(50_000)
        y = (rng.random(s.shape[0]) < s**1.4).astype(int)
        status, out = await call(app, "/calibrators", orjson.dumps(
            {"name": "iso", "method": "isotonic", "holdout": {"scores": s.tolist(), "labels": y.tolist()}}), key)
        assert status == 201, out
        z = rng.normal(0.0, 2.0, size=(5_000, 10))
        status, out = await call(app, "/calibrators", orjson.dumps(
            {"name": "temp10", "method": "temperature", "input": "logit",
             "holdout": {"scores": z.tolist(), "labels": rng.integers(0, 10, 5_000).tolist()}}), key)
        assert status == 201, out
        payloads = ct.bodies(np.random.default_rng(0))
        paths = [f"/profile/step{level}" for level in range(5)]
        for wkey, *_ in ct.WORKLOADS:
            n = requests if wkey != "1c" else max(100, requests // 15)
            for path in paths:
                for _ in range(20):
                    status, out = await call(app, path, payloads[wkey], key)
                    assert status == 200, (path, out)
            samples = {path: [] for path in paths}
            clock = time.perf_counter
            for i in range(n):
                for path in (paths if i % 2 == 0 else paths[::-1]):
                    started = clock()
                    await call(app, path, payloads[wkey], key)
                    samples[path].append(clock() - started)
            results[wkey] = {letter: statistics.median(samples[path]) for (letter, _), path in zip(STEPS, paths)}
            print(f"  {wkey}: " + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in results[wkey].items()),
                  file=sys.stderr, flush=True)
        calls = await temperature_calls(app, key, payloads["1d"], requests)
    shutil.rmtree(folder, ignore_errors=True)
    return results, calls


#: The quick path's calls as the table names them: check, scale, exp, row sums, normalise.
TEMPERATURE_CALLS = [
    "np.vdot(z, z) < (600 T)^2",
    "w = z / T",
    "np.exp(w, out=w)",
    "s = np.add.reduce(w, axis=1, keepdims=True)",
    "w /= s",
]


async def temperature_calls(app, key: str, body: bytes, requests: int) -> dict[str, tuple[float, float]]:
    """Median seconds of each numpy call of the temperature quick path, and of predict_details:
    (in a loop of its own, once after each request through the app)."""
    from calibd.api.bodies import float_array

    from calibd.calibration.temperature import _unshifted_softmax

    loaded = app.state.services.store.get("temp10", None)
    calibrator, t = loaded.calibrator, loaded.calibrator.temperature_
    rows = orjson.loads(body)["scores"]
    z = float_array(rows)
    clock = time.perf_counter_ns

    def timed_calls() -> tuple[list[int], np.ndarray]:
        times = [clock()]
        np.vdot(z, z) < (600.0 * t) ** 2
        times.append(clock())
        w = z / t
        times.append(clock())
        np.exp(w, out=w)
        times.append(clock())
        s = np.add.reduce(w, axis=1, keepdims=True)
        times.append(clock())
        w /= s
        times.append(clock())
        return [b - a for a, b in zip(times, times[1:])], w

    def timed_predict() -> list[int]:
        times = [clock()]
        _unshifted_softmax(z / t)  # the numpy path, whole
        times.append(clock())
        if calibrator.predict_compiled(rows) is None:  # the kernel on the list, as /calibrate calls it
            calibrator.predict_details(z)
        times.append(clock())
        return [b - a for a, b in zip(times, times[1:])]

    # The same arithmetic as the calibrator's numpy path, bit for bit, or this table describes other code.
    np.testing.assert_array_equal(timed_calls()[1], _unshifted_softmax(z / t))
    warm = [timed_calls()[0] + timed_predict() for _ in range(requests)]
    cold: list[list[int]] = [[], []]
    for i in range(2 * requests):
        # After a request to the baseline route (step B), which runs none of these calls.
        await call(app, "/profile/step1", body, key)
        cold[i % 2].append(timed_calls()[0] if i % 2 == 0 else timed_predict())
    cold_rows = [calls + predict for calls, predict in zip(*cold)]
    labels = [*TEMPERATURE_CALLS, "the numpy path, all of it", "the compiled kernel on the JSON list (as /calibrate calls it)"]
    return {label: (statistics.median(x[i] for x in warm) / 1e9, statistics.median(x[i] for x in cold_rows) / 1e9)
            for i, label in enumerate(labels)}


def py_spy_profile(py_spy: str, seconds: float) -> dict[str, list[tuple[float, str]]]:
    """Own-time shares of the busiest frames of a served /calibrate and baseline, on the 10,000-score
    workload and the temperature one."""
    payloads = ct.bodies(np.random.default_rng(0))
    out = {}
    with Server() as server:
        ct.fit_calibrators(server, np.random.default_rng(1))
        auth = server.headers["Authorization"]
        for workload in ("1c", "1d"):
            for route, path in (("/calibrate", "/calibrate"), ("baseline", "/benchmark/calibrate-baseline")):
                url = server.url + path
                run_wrk(url, payloads[workload], auth, 1.0, 8)
                folder = Path(tempfile.mkdtemp(prefix="py-spy-"))
                spy = subprocess.Popen([py_spy, "record", "-p", str(server.process.pid), "-d", str(int(seconds)), "-r",
                                        "250", "-f", "raw", "-o", str(folder / "raw.txt"), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                run_wrk(url, payloads[workload], auth, seconds + 2, 8)
                spy.wait()
                own: collections.Counter = collections.Counter()
                total = 0
                raw = folder / "raw.txt"
                for line in (raw.read_text().splitlines() if raw.exists() else []):
                    stack, _, count = line.rpartition(" ")
                    frame = stack.split(";")[-1]
                    total += int(count)
                    own[frame] += int(count)
                shutil.rmtree(folder, ignore_errors=True)
                out[f"{route}, {workload}"] = [(n / total, frame) for frame, n in own.most_common(12)] if total else []
    return out


def gil_trial(elements: int, sleep_seconds: float, calls: int = 4000) -> float:
    """Median seconds of np.add on ``elements`` floats after some Python work, beside a thread
    sleeping ``sleep_seconds`` in a loop (0: no other thread)."""
    import json
    import threading

    if sleep_seconds:
        def sleeper() -> None:
            while True:
                time.sleep(sleep_seconds)

        threading.Thread(target=sleeper, daemon=True).start()
    work = [{"key": i, "value": str(i)} for i in range(300)]
    a = np.random.default_rng(0).random(elements)
    times = []
    for _ in range(calls):
        json.dumps(work)
        started = time.perf_counter()
        np.add(a, a)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def gil_tax() -> dict[tuple[int, float], float]:
    """gil_trial for each case, each in its own interpreter."""
    out = {}
    for elements in (1000, 400):
        for sleep_seconds in (0.0, 0.02, 0.25):
            run = subprocess.run([sys.executable, __file__, "--gil-trial", str(elements), str(sleep_seconds)],
                                 capture_output=True, text=True, check=True)
            out[elements, sleep_seconds] = float(run.stdout.split()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per route and workload (default 3000)")
    parser.add_argument("--py-spy", default=None, help="py-spy executable")
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--seconds", type=float, default=8.0, help="py-spy recording per route (default 8)")
    parser.add_argument("--gil-trial", nargs=2, type=float, help=argparse.SUPPRESS)  # one gil_trial, printed
    args = parser.parse_args(argv)
    if args.gil_trial:
        print(gil_trial(int(args.gil_trial[0]), args.gil_trial[1]))
        return 0
    started_machine = machine()
    results, calls = asyncio.run(breakdown(args.requests))
    labels = {key: label for key, label, *_ in ct.WORKLOADS}
    lines = [
        "## Where /calibrate's time goes (profile)",
        "",
        f"`benchmarks/calibrate_profile.py --requests {args.requests}`; {started_machine}. In process, through the "
        "whole app (middleware, routing, auth, access log) without sockets; routes that each add one step of "
        "/calibrate's work, timed request by request in interleaved order (median, microseconds). Each step's cost is "
        "its row minus the one above; B / E is the in-process counterpart of the throughput ratio (uvicorn's and the "
        "kernel's share of a served request, the same for both, is left out, so the served ratio is higher). The "
        "access line is written to /dev/null in the request's thread: the server's background log writer would, in "
        "a loop that never waits on a socket, rarely get the GIL, and each GIL-releasing numpy call would pay to "
        "wake it.",
        "",
        "| step | " + " | ".join(labels[k] for k in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for letter, text in STEPS:
        cells = []
        for key in results:
            value = results[key][letter]
            previous = results[key][chr(ord(letter) - 1)] if letter != "A" else None
            cells.append(f"{value * 1e6:.0f}" + ("" if previous is None else f" ({(value - previous) * 1e6:+.0f})"))
        lines.append(f"| {letter}: {text} | " + " | ".join(cells) + " |")
    lines.append("| B / E (in process; the throughput ratio's counterpart) | "
                 + " | ".join(f"{results[k]['B'] / results[k]['E']:.2f}" for k in results) + " |")
    lines.append("| A / E (against the parsed scores alone) | "
                 + " | ".join(f"{results[k]['A'] / results[k]['E']:.2f}" for k in results) + " |")
    lines += ["", "The temperature workload's predict (100 rows x 10 classes), call by call: the numpy calls of the "
              "calibrator's numpy path (CALIBD_KERNELS=0), each timed in a loop of its own (warm) and once after each "
              "request through the app (as a served request meets them), median, microseconds; then that path whole, "
              "and the compiled kernel reading the JSON list, which /calibrate calls instead. What a numpy call costs "
              "on a request is mostly fixed (dispatch, and code and data evicted by the rest of the request), not "
              "arithmetic; a softmax needs a check, a scale, exp, row sums and a division, so five is the least numpy "
              "calls can do it in, where the kernel makes one call, with no float64 array of the list made first.", "",
              "| call | warm | after a request |", "|---|---:|---:|"]
    for label, (warm, cold) in calls.items():
        lines.append(f"| `{label}` | {warm * 1e6:.1f} | {cold * 1e6:.1f} |")
    tax = gil_tax()
    lines += ["", "The GIL hand-off tax (median of one np.add after ~30 us of Python work, each case in a fresh "
              "interpreter, microseconds). numpy releases the GIL for more than 500 elements; a thread that sleeps "
              "in a loop beside it, like the server's log writer, makes each release wake it:", "",
              "| np.add on | alone | beside a thread waking every 20 ms | every 250 ms |", "|---|---:|---:|---:|"]
    for elements in (1000, 400):
        lines.append(f"| {elements:,} floats | " + " | ".join(f"{tax[elements, s] * 1e6:.1f}" for s in (0.0, 0.02, 0.25)) + " |")
    py_spy = args.py_spy or shutil.which("py-spy") or ("/tmp/prof-venv/bin/py-spy" if Path("/tmp/prof-venv/bin/py-spy").exists() else None)
    if args.no_py_spy or not py_spy:
        lines += ["", "py-spy profile: not run (" + ("--no-py-spy" if args.no_py_spy else "py-spy not found") + ")."]
    else:
        profile = py_spy_profile(py_spy, args.seconds)
        lines += ["", f"py-spy ({py_spy}), {args.seconds:g} s of each route under wrk, on the 10,000-score workload "
                      "(1c) and the temperature one (1d), own samples by frame (the line that was running), the top 12:", ""]
        for route, rows in profile.items():
            lines += [f"**{route}**", "", "| share | frame |", "|---:|---|",
                      *(f"| {share:.1%} | `{frame}` |" for share, frame in rows), ""]
    write_results("calibrate_profile", "\n".join(lines), [])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
