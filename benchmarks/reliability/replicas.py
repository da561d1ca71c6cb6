"""Two calibd processes on one PostgreSQL: concurrent fits, promotion delay, identical monitors.

    .venv/bin/python benchmarks/reliability/replicas.py              # 50 promotions, 40 feedback batches
    .venv/bin/python benchmarks/reliability/replicas.py --promotions 200

20 concurrent fits of one name across both give versions 1..20; every
promotion made on one is served by the other within one second (the delay is
measured); the monitor route and the /metrics monitor gauges are identical on
both. The test in make test (tests/test_reliability_replicas.py) promotes 6 times.
"""

from __future__ import annotations

import argparse

from _common import database, record, workdir

from tests.reliability.scenarios import run_replicas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--promotions", type=int, default=50)
    parser.add_argument("--feedback-batches", type=int, default=40)
    parser.add_argument("--fits", type=int, default=20)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="postgresql")
    args = parser.parse_args()
    with database(args.database) as url:
        figures = run_replicas(url, workdir("replicas"), args.promotions, args.feedback_batches, args.fits)
    record("replicas", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
