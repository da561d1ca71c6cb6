"""Per-request CPU cost of /calibrate and its baseline, in process (a profiling aid, not a target).

    .venv/bin/python benchmarks/_inprocess.py [--requests 3000] [--profile KEY]

Calls the ASGI app directly (no sockets, no uvicorn), so the figures are the
Python-level cost of a request: middleware, routing, auth, parsing, the route
and the JSON answer. On a busy machine wall-clock throughput moves with the
neighbours; process CPU time per request barely does, so this is where hot
path changes are measured before wrk confirms them. ``--profile KEY`` runs
cProfile (CPU-time clock) over the /calibrate requests of one workload.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

os.environ["CALIBD_BENCHMARK_ROUTES"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from app.config import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from app.storage import migrate  # noqa: E402
from app.storage.db import make_engine  # noqa: E402
import calibrate_throughput as ct  # noqa: E402


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


async def main_async(args) -> None:
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder / 'calibd.db'}"
    engine = make_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    key = f"calibd_bench_{secrets.token_hex(8)}"
    import logging
    settings = Settings(database_url=url, bootstrap_admin_key=key, fit_workers=0)
    app = create_app(settings)
    handler_stream = open(os.devnull, "w")
    for name in ("calibd", "calibd.access"):
        for h in logging.getLogger(name).handlers:
            h.setStream(handler_stream)
    async with app.router.lifespan_context(app):
        rng = np.random.default_rng(1)
        s = rng.random(50_000)
        y = (rng.random(s.shape[0]) < s**1.4).astype(int)
        status, out = await call(app, "/calibrators", orjson.dumps(
            {"name": "iso", "method": "isotonic", "holdout": {"scores": s.tolist(), "labels": y.tolist()}}), key)
        assert status == 201, out
        z = rng.normal(0.0, 2.0, size=(5_000, 10))
        labels = rng.integers(0, 10, 5_000)
        status, out = await call(app, "/calibrators", orjson.dumps(
            {"name": "temp10", "method": "temperature", "input": "logit",
             "holdout": {"scores": z.tolist(), "labels": labels.tolist()}}), key)
        assert status == 201, out
        payloads = ct.bodies(np.random.default_rng(0))
        for wkey, label, *_ in ct.WORKLOADS:
            n = args.requests if wkey != "1c" else max(50, args.requests // 30)
            paths = {"baseline": "/benchmark/calibrate-baseline", "calibrate": "/benchmark/calibrate-baseline" if args.aa else "/calibrate"}
            for path in paths.values():
                for _ in range(20):
                    status, out = await call(app, path, payloads[wkey], key)
                    assert status == 200, out
            block = max(5, n // 10)
            samples = {"baseline": [], "calibrate": []}
            ratios = []
            for rep in range(args.blocks):
                for route in (("baseline", "calibrate") if rep % 2 == 0 else ("calibrate", "baseline")):
                    started = time.process_time()
                    for _ in range(block):
                        await call(app, paths[route], payloads[wkey], key)
                    samples[route].append((time.process_time() - started) / block)
                ratios.append(samples["baseline"][-1] / samples["calibrate"][-1])
            costs = {route: statistics.median(v) for route, v in samples.items()}
            print(f"{label:40s} baseline {costs['baseline'] * 1e6:8.1f} us  calibrate {costs['calibrate'] * 1e6:8.1f} us"
                  f"  extra {(costs['calibrate'] - costs['baseline']) * 1e6:7.1f} us  ratio {statistics.median(ratios):.3f}"
                  f"  (quartiles {np.quantile(ratios, 0.25):.3f}-{np.quantile(ratios, 0.75):.3f})",
                  flush=True)
            if args.profile == wkey:
                # Per-request CPU time by function, /calibrate minus the baseline: what calibrating adds.
                totals = {}
                for route in ("baseline", "calibrate"):
                    profiler = cProfile.Profile(time.process_time)
                    profiler.enable()
                    for _ in range(n):
                        await call(app, paths[route], payloads[wkey], key)
                    profiler.disable()
                    stats = pstats.Stats(profiler).stats
                    totals[route] = {f"{fn[2]} ({Path(fn[0]).name}:{fn[1]})": v[2] / n for fn, v in stats.items()}
                names = set(totals["baseline"]) | set(totals["calibrate"])
                diff = sorted(((totals["calibrate"].get(f, 0) - totals["baseline"].get(f, 0), f) for f in names), reverse=True)
                print("own time per request, /calibrate minus baseline (us):")
                for d, f in diff[:25]:
                    print(f"  {d * 1e6:8.2f}  {f}")
                print(f"  total: {sum(d for d, _ in diff) * 1e6:.1f} us; most negative:", *(f"{d * 1e6:.2f} {f}" for d, f in diff[-5:]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--blocks", type=int, default=20, help="alternating blocks of each route")
    parser.add_argument("--aa", action="store_true", help="A/A: the baseline against itself (the noise floor)")
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
