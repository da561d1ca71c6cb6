"""What ``calibd serve``'s read timeouts cost a request: the raw ASGI echo through uvicorn's
HttpToolsProtocol and through calibd's TimedHTTPProtocol (app/cli/serving.py), in process.

    .venv/bin/python benchmarks/timed_protocol.py [--batches 40] [--batch 300]

The in-memory connection of benchmarks/layer_profile.py (no sockets, no load generator), one
request at a time; batches of the two protocols interleaved, their order alternating. Prints
process CPU per request (medians over batches) and the median of the per-pair ratios; writes
no results file.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate_throughput as ct  # noqa: E402
import echo_app  # noqa: E402
import layer_profile as lp  # noqa: E402
from uvicorn.config import Config  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from calibd.cli.serving import TimedHTTPProtocol  # noqa: E402


class TimedConnection(lp.Connection):
    """layer_profile's connection, served by TimedHTTPProtocol."""

    def __init__(self, app, loop):
        config = Config(app=app, http="httptools", loop="none", lifespan="off", log_config=None, access_log=False)
        config.load()
        self.transport = lp.Transport()
        self.protocol = TimedHTTPProtocol(config, ServerState(), {}, _loop=loop)
        self.protocol.connection_made(self.transport)
        self.loop = loop


async def measure(args) -> None:
    loop = asyncio.get_running_loop()
    payloads = ct.bodies(np.random.default_rng(0))
    connections = {"uvicorn": lp.Connection(echo_app.raw_app, loop), "timed": TimedConnection(echo_app.raw_app, loop)}
    labels = {key: label for key, label, *_ in ct.WORKLOADS}
    for key in ("1a", "1b", "1d"):
        raw = lp.http_request("/echo", payloads[key], key=None)
        cpu: dict[str, list[float]] = {name: [] for name in connections}
        for _ in range(3):  # warm
            for connection in connections.values():
                await lp.batch(connection, raw, args.batch)
        for i in range(args.batches):
            for name in (("uvicorn", "timed") if i % 2 else ("timed", "uvicorn")):
                cpu[name].append((await lp.batch(connections[name], raw, args.batch))[0])
        plain, timed = (statistics.median(cpu[name]) * 1e6 for name in ("uvicorn", "timed"))
        ratio = statistics.median(t / u for t, u in zip(cpu["timed"], cpu["uvicorn"]))
        print(f"{labels[key]}: raw echo, CPU per request: HttpToolsProtocol {plain:.1f} us, TimedHTTPProtocol "
              f"{timed:.1f} us ({timed - plain:+.1f} us); timed / plain, median of batch pairs {ratio:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=40, help="batches per protocol (default 40)")
    parser.add_argument("--batch", type=int, default=300, help="requests per batch (default 300)")
    uvloop.run(measure(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
