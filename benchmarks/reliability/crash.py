"""kill -9 calibd repeatedly while a client process sends feedback with Idempotency-Keys; restart each time.

    .venv/bin/python benchmarks/reliability/crash.py                 # 5 kills, 300 batches of 50, both databases
    .venv/bin/python benchmarks/reliability/crash.py --kills 10 --database postgresql

Every acknowledged item is stored, exactly once. The test in make test
(tests/test_reliability_crash.py) kills once, 40 batches.
"""

from __future__ import annotations

import argparse

from _common import database, record, workdir

from tests.reliability.scenarios import run_crash


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    figures = {}
    for kind in ("sqlite", "postgresql") if args.database == "both" else (args.database,):
        with database(kind) as url:
            figures[kind] = run_crash(url, workdir("crash"), args.batches, args.kills, args.batch_size)
    record("crash", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
