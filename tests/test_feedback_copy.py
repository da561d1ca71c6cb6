"""The block COPY of plain feedback rows writes exactly what the row-by-row COPY writes (PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
from sqlalchemy import text

from calibd.monitoring.windows import feedback_terms
from calibd.storage import feedback
from calibd.storage.db import make_engine, make_sessionmaker, transaction
from calibd.storage.feedback import LabelledBatch

from .conftest import migrated_database


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    with migrated_database("postgresql", tmp_path_factory.mktemp("copy")) as url:
        engine = make_engine(url)
        yield make_sessionmaker(engine)
        engine.dispose()


def stored(sessions, calibrator_id: int) -> list[tuple]:
    with transaction(sessions) as session:
        return [tuple(row) for row in session.execute(text(
            "SELECT calibrator_id, version, prediction_id, probability, label, probabilities, accepted, scores, features, "
            "received_at, predicted_at, waiting FROM feedback WHERE calibrator_id = :c ORDER BY id"), {"c": calibrator_id})]


@pytest.mark.parametrize("with_acceptance", [False, True])
def test_the_block_copy_stores_what_the_row_copy_stores(sessions, with_acceptance):
    rng = np.random.default_rng(3)
    n = 3_001
    # Edge values: 0, 1, subnormal, the largest float below 1, and a time with microseconds.
    probability = np.concatenate([[0.0, 1.0, 5e-324, np.nextafter(1.0, 0.0)], rng.uniform(size=n - 4)])
    labels = rng.integers(0, 2, n)
    accepted = rng.uniform(size=n) < 0.7 if with_acceptance else None
    batch = LabelledBatch(version=7, probabilities=probability, labels=labels, accepted=accepted)
    terms = feedback_terms(batch.probabilities, batch.labels, batch.accepted)
    now = datetime(2026, 11, 25, 1, 2, 3, 456789, tzinfo=timezone.utc)
    block, by_row = 900_001 + with_acceptance * 2, 900_002 + with_acceptance * 2
    with transaction(sessions) as session:
        feedback._copy_plain(session, block, 7, now, terms.probability, batch.labels, batch.accepted)
        columns = feedback._columns(batch, terms.probability, now, waiting=False)
        feedback._copy_feedback(session, by_row, 7, now, columns, features=False, waiting=False)
    from_block, from_rows = stored(sessions, block), stored(sessions, by_row)
    assert len(from_block) == n
    assert [row[1:] for row in from_block] == [row[1:] for row in from_rows]
    assert from_block[4][3] == probability[4] and from_block[0][9] == now
    assert from_block[0][10] == now and from_block[0][11] is False  # mature on arrival, predicted at receipt
    assert [row[6] for row in from_block] == ([None] * n if accepted is None else accepted.tolist())
