"""Load: mixed traffic from a separate process against ``calibd serve`` on PostgreSQL, zero errors.

The feedback count stored equals the count acknowledged. Short variant (12 s);
the 60 s one is ``benchmarks/reliability/load.py``.
"""

from __future__ import annotations

import pytest

from .conftest import migrated_database
from .reliability.scenarios import run_load


@pytest.mark.slow
def test_mixed_load_has_no_errors_and_stores_every_acknowledged_label(tmp_path):
    with migrated_database("postgresql", tmp_path) as url:
        figures = run_load(url, tmp_path, seconds=12, concurrency=8)
    assert figures["errors"] == 0 and figures["feedback_lost"] == 0
    assert figures["feedback_stored"] == figures["feedback_acknowledged"] > 0
