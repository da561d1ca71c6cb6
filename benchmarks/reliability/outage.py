"""Stop a private PostgreSQL cluster for 10 s while calibd serves traffic on it, then start it again.

    .venv/bin/python benchmarks/reliability/outage.py                # one 10 s outage
    .venv/bin/python benchmarks/reliability/outage.py --seconds 30 --repeat 3

/calibrate serves throughout; /feedback answers 503 with Retry-After, then
succeeds once the database is back, without a restart of calibd; nothing
acknowledged is lost. The cluster is created with initdb in a temporary folder
on its own port; the shared one is never touched. The test in make test
(tests/test_reliability_outage.py) stops it for 5 s.
"""

from __future__ import annotations

import argparse

from _common import record, workdir

from tests.reliability.scenarios import run_outage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    runs = [run_outage(workdir("outage"), args.seconds) for _ in range(args.repeat)]
    record("outage", runs[0] if len(runs) == 1 else {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
