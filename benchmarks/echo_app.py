"""The bare echo server the throughput benchmark measures calibd against.

    .venv/bin/python benchmarks/echo_app.py --port 8001 [--workers 1]

A FastAPI app with one route, ``POST /echo``: it parses the body with orjson
and answers ``{"calibrator", "version", "probabilities"}`` with the scores it
was sent, serialised by orjson; an answer the size of /calibrate's. No
middleware, no auth, no logs, no metrics: the floor a user would compare
calibd with. It is served by uvicorn with the flags ``calibd serve`` passes
(app/cli.py: a factory, uvloop and httptools by uvicorn's defaults, no
uvicorn access log, the same worker count).
"""

from __future__ import annotations

import argparse

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response


def create_app() -> FastAPI:
    app = FastAPI(title="echo")

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        data = orjson.loads(await request.body())
        body = {"calibrator": data["calibrator"], "version": 1, "probabilities": data["scores"]}
        return Response(orjson.dumps(body), media_type="application/json")

    @app.get("/readyz")
    async def ready() -> Response:
        return Response(b'{"status":"ready"}', media_type="application/json")

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    uvicorn.run(
        "echo_app:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        log_config=None, access_log=False,
    )


if __name__ == "__main__":
    main()
