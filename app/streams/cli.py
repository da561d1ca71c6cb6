"""``calibd consume``: labels from a Redis stream into calibd's feedback (see consumer.py)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys


def add_consume_command(commands) -> None:
    consume = commands.add_parser(
        "consume", help="record labels from a Redis stream (consumer group; exactly once)",
        description="Read feedback messages from a Redis stream through a consumer group and record them in "
        "calibd (CALIBD_URL, CALIBD_API_KEY with the feedback scope), acknowledging each message only after its "
        "rows are committed. Bad messages go to the dead-letter stream with the reason.")
    consume.add_argument("--redis", default=os.environ.get("CALIBD_REDIS_URL", "redis://127.0.0.1:6379/0"),
                         help="Redis URL (CALIBD_REDIS_URL)")
    consume.add_argument("--stream", default=os.environ.get("CALIBD_STREAM", "calibd:feedback"),
                         help="the stream's key (CALIBD_STREAM)")
    consume.add_argument("--group", default="calibd", help="the consumer group")
    consume.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}",
                         help="this consumer's name in the group (a pod's name keeps its pending messages across restarts)")
    consume.add_argument("--dead-letter", help="the dead-letter stream (default: STREAM:dead-letter)")
    consume.add_argument("--batch", type=int, default=5000, help="messages read at a time")
    consume.add_argument("--claim-idle-ms", type=int, default=30_000,
                         help="reclaim messages another consumer left pending this long (XAUTOCLAIM)")
    consume.add_argument("--url", default=os.environ.get("CALIBD_URL", "http://127.0.0.1:8000"), help="calibd's URL")
    consume.add_argument("--metrics-port", type=int, help="serve this consumer's /metrics on this port")
    consume.add_argument("--until-idle", action="store_true", help="stop once nothing is new nor pending")
    consume.set_defaults(handler=consume_command)


def consume_command(args: argparse.Namespace) -> int:
    try:
        import prometheus_client
        import redis
    except ModuleNotFoundError as error:
        print(f"calibd: `calibd consume` needs {error.name}: pip install 'calibd[streams]'", file=sys.stderr)
        return 2
    from .consumer import FeedbackTarget, StreamConsumer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.metrics_port is not None:
        prometheus_client.start_http_server(args.metrics_port, addr="127.0.0.1")
    consumer = StreamConsumer(
        redis.Redis.from_url(args.redis), args.stream, args.group, args.consumer,
        FeedbackTarget(args.url, os.environ.get("CALIBD_API_KEY")), dead_letter=args.dead_letter, batch=args.batch,
        claim_idle_ms=args.claim_idle_ms,
    )
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    print(f"calibd: consuming {args.stream} as {args.consumer} of group {args.group} into {args.url}", file=sys.stderr)
    try:
        consumer.run(until_idle=args.until_idle)
    except KeyboardInterrupt:
        pass
    return 0
