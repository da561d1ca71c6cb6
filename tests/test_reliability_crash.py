"""Crash: ``kill -9`` calibd while a client process sends feedback; restart; nothing acknowledged is lost.

The client sends batches with an Idempotency-Key and retries each until a 202,
recording every acknowledgement durably. Batches of labels for logged
predictions are traced row by row (by prediction id); batches of labelled
probabilities by their calibrator's count and their idempotency records.
Short variant (1 kill); the long one is ``benchmarks/reliability/crash.py``.
"""

from __future__ import annotations

import pytest

from .reliability.scenarios import run_crash


@pytest.mark.slow
def test_killed_server_loses_no_acknowledged_feedback(fresh_database, tmp_path):
    figures = run_crash(fresh_database, tmp_path, batches=40, kills=1, batch_size=50)
    assert figures["items_lost"] == 0 and figures["items_doubled"] == 0
    assert figures["items_stored"] == figures["items_acknowledged"] == 40 * 50
    assert all(n > 0 for n in figures["acknowledged_before_each_kill"])
