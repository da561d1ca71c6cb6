"""Send planned feedback batches until each is acknowledged, recording every acknowledgement durably.

    python -m tests.reliability.feedback_client --url URL --plan plan.json --acks acks.jsonl [--key KEY]

The plan is a JSON list of ``{"key": <Idempotency-Key>, "body": <POST /feedback body>}``.
``--concurrency`` threads take batches in order; each batch is retried with its
own Idempotency-Key, through connection errors (the server was killed) and
503s (the database is away), until a 202 comes back. Each 202 is then
appended to ``--acks`` as a JSON line and fsynced before the next request, so
the record of what was acknowledged survives whatever happens to the server.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", default=None)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=600, help="give up after this many seconds")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between a worker's batches")
    args = parser.parse_args(argv)

    plan = json.loads(Path(args.plan).read_text())
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    lock = threading.Lock()
    acks = open(args.acks, "a")
    next_batch = iter(range(len(plan)))
    deadline = time.monotonic() + args.deadline
    failures: list[str] = []
    counters = {"connection_errors": 0, "unavailable": 0}

    def record(line: dict) -> None:
        with lock:
            acks.write(json.dumps(line) + "\n")
            acks.flush()
            os.fsync(acks.fileno())

    def work() -> None:
        with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
            while True:
                with lock:
                    index = next(next_batch, None)
                if index is None:
                    return
                batch = plan[index]
                attempts = 0
                while True:
                    if time.monotonic() > deadline:
                        failures.append(f"batch {index} never acknowledged")
                        return
                    attempts += 1
                    try:
                        response = http.post("/feedback", json=batch["body"], headers={"Idempotency-Key": batch["key"]})
                    except httpx.TransportError:
                        with lock:
                            counters["connection_errors"] += 1
                        time.sleep(0.05)
                        continue
                    if response.status_code == 503:
                        with lock:
                            counters["unavailable"] += 1
                        time.sleep(0.1)
                        continue
                    if response.status_code != 202:
                        failures.append(f"batch {index}: {response.status_code} {response.text[:300]}")
                        return
                    receipt = response.json()
                    record({
                        "batch": index,
                        "key": batch["key"],
                        "count": receipt["count"],
                        "unknown_ids": receipt["unknown_ids"],
                        "replayed": response.headers.get("Idempotent-Replayed") == "true",
                        "attempts": attempts,
                        "at": time.time(),
                    })
                    break
                if args.pause:
                    time.sleep(args.pause)

    threads = [threading.Thread(target=work) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acks.close()
    Path(args.acks + ".summary").write_text(json.dumps(counters | {"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
