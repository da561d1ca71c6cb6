"""Shared by the reliability scripts: databases, and recording figures with when and where they were measured."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.reliability.harness import machine, now_utc  # noqa: E402

RESULTS = Path(__file__).with_name("results")


@contextmanager
def database(kind: str):
    """A fresh migrated database: a SQLite file, or a schema of its own on the shared PostgreSQL."""
    from tests.conftest import migrated_database

    with tempfile.TemporaryDirectory(prefix="calibd-reliability-") as folder:
        with migrated_database(kind, Path(folder)) as url:
            yield url


def workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"calibd-{name}-"))


def record(name: str, figures: dict) -> None:
    """Print the figures and keep them in results/<name>.json, for docs/RELIABILITY.md."""
    entry = {
        "command": " ".join([".venv/bin/python", os.path.relpath(sys.argv[0], REPO), *map(shlex.quote, sys.argv[1:])]),
        "date": now_utc(),
        "machine": machine(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(entry, indent=1, default=str) + "\n")
    print(json.dumps(entry, indent=1, default=str))
