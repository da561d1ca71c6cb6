"""schemathesis against a live calibd on each database: no 5xx, every response as documented.

    .venv/bin/python benchmarks/reliability/fuzz.py                      # 200 examples per operation and phase
    .venv/bin/python benchmarks/reliability/fuzz.py --max-examples 50    # quicker

The test in make test (tests/test_reliability_fuzz.py) runs the same at 25.
"""

from __future__ import annotations

import argparse

from _common import database, record, workdir

from tests.reliability.fuzz import run_fuzz
from tests.reliability.harness import CalibdProcess, admin_key


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    figures, failed = {}, False
    for kind in ("sqlite", "postgresql") if args.database == "both" else (args.database,):
        key = admin_key()
        folder = workdir("fuzz")
        with database(kind) as url, CalibdProcess(url, folder, name="fuzz", bootstrap_admin_key=key) as server:
            result = run_fuzz(server, key, folder / "schemathesis", args.max_examples, args.seed)
        output = result.pop("output")
        figures[kind] = result
        if result["exit_code"] or result["server_errors"] or result["failures"] or result["errors"]:
            failed = True
            print(output)
    figures["requests_total"] = sum(figures[k]["requests"] for k in figures if isinstance(figures[k], dict))
    record("fuzz", figures)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
