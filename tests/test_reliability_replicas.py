"""Replicas: two ``calibd serve`` processes on one PostgreSQL behave as one service.

20 concurrent fits of one name, split between the processes, get versions
1..20; a promotion made on either is served by the other within one second;
monitor values (the monitor route and the /metrics gauges) are identical on
both after feedback sent to either. (Two in-process servers on each database:
tests/test_api_concurrency.py.) The long variant is
``benchmarks/reliability/replicas.py``.
"""

from __future__ import annotations

import pytest

from .conftest import migrated_database
from .reliability.scenarios import run_replicas


@pytest.mark.slow
def test_two_processes_on_one_postgresql_behave_as_one_service(tmp_path):
    with migrated_database("postgresql", tmp_path) as url:
        figures = run_replicas(url, tmp_path, promotions=6, feedback_batches=6, fits=20)
    assert figures["promotion_delay_seconds"]["max"] < 1.0
    assert figures["monitor_identical"]
