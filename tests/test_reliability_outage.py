"""Database outage: a private PostgreSQL cluster stopped for a few seconds during traffic.

/calibrate keeps serving cached calibrators; /feedback (and the registry)
answer 503 with Retry-After, then succeed once PostgreSQL is back, without
restarting calibd; nothing acknowledged is lost. Short variant (5 s); the
10 s one is ``benchmarks/reliability/outage.py``. The shared cluster is never
touched.
"""

from __future__ import annotations

import os

import pytest

from .reliability.harness import PrivatePostgres, _postgres_bin
from .reliability.scenarios import run_outage


def _postgres_server_installed() -> bool:
    try:
        _postgres_bin("initdb")
        _postgres_bin("pg_ctl")
        return True
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_calibrate_serves_through_a_database_outage_and_feedback_recovers(tmp_path):
    if not _postgres_server_installed():
        if os.environ.get("CI"):
            pytest.fail("the PostgreSQL server binaries (initdb, pg_ctl) are required in CI")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed")
    figures = run_outage(tmp_path, outage_seconds=5)
    assert figures["calibrate_failures"] == 0 and figures["calibrate_requests_during_outage"] > 0
    assert figures["feedback_503_with_retry_after"] > 0
    assert figures["items_lost"] == 0 and figures["items_stored"] == figures["items_acknowledged"] > 0
    assert not figures["calibd_restarted"]
