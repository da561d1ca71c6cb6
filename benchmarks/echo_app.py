"""The bare echo servers the throughput benchmarks measure calibd against.

    .venv/bin/python benchmarks/echo_app.py --port 8001 [--workers 1] [--raw]

A FastAPI app with one route, ``POST /echo``: it parses the body with orjson
and answers ``{"calibrator", "version", "probabilities"}`` with the scores it
was sent, serialised by orjson; an answer the size of /calibrate's. No
middleware, no auth, no logs, no metrics: the floor a user would compare
calibd with. It is served by uvicorn with the flags ``calibd serve`` passes
(app/cli.py: a factory, uvloop and httptools by uvicorn's defaults, no
uvicorn access log, the same worker count).

``--raw`` serves ``raw_app`` instead: the same answer from a plain ASGI
callable, no framework at all (orjson in and out, the body read from
``receive`` and the answer sent in two messages). It is the floor of any
Python service on this uvicorn: what the server itself costs a request.
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


_HEADERS = [(b"content-type", b"application/json")]


async def raw_app(scope, receive, send) -> None:
    """The echo as a plain ASGI app: POST any path answers the scores it was sent; GET /readyz."""
    kind = scope["type"]
    if kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if kind != "http":
        return
    if scope["method"] == "POST":
        message = await receive()
        body = message.get("body", b"")
        if message.get("more_body", False):
            chunks = [body]
            while message.get("more_body", False):
                message = await receive()
                chunks.append(message.get("body", b""))
            body = b"".join(chunks)
        data = orjson.loads(body)
        payload = orjson.dumps({"calibrator": data["calibrator"], "version": 1, "probabilities": data["scores"]})
    else:
        payload = b'{"status":"ready"}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(payload)).encode()), *_HEADERS]})
    await send({"type": "http.response.body", "body": payload})


def create_raw_app():
    return raw_app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--raw", action="store_true", help="the plain ASGI echo (raw_app), no framework")
    args = parser.parse_args()
    uvicorn.run(
        "echo_app:create_raw_app" if args.raw else "echo_app:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        log_config=None, access_log=False,
    )


if __name__ == "__main__":
    main()
