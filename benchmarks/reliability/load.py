"""Mixed traffic (calibrate, feedback, fits, evaluate) from a separate process against calibd on PostgreSQL.

    .venv/bin/python benchmarks/reliability/load.py                  # 60 s, 8 concurrent clients
    .venv/bin/python benchmarks/reliability/load.py --seconds 300

Zero errors; the feedback stored (counted in the database) equals the feedback acknowledged.
The test in make test (tests/test_reliability_load.py) runs 12 s.
"""

from __future__ import annotations

import argparse

from _common import database, record, workdir

from tests.reliability.scenarios import run_load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="postgresql")
    args = parser.parse_args()
    with database(args.database) as url:
        figures = run_load(url, workdir("load"), args.seconds, args.concurrency)
    record("load", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
