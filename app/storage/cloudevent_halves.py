"""Unpaired halves of POST /cloudevents shared between processes (table ``cloudevent_halves``).

A process writes the halves that waited unpaired in it for a while; one row an id. A half whose
id already has a row takes that row if it is the other half (the pair is then this process's to
log) and leaves it if it is the same half (a duplicate). The id's primary key settles two
processes writing the two halves at once: the second INSERT waits for the first to commit, then
conflicts, and takes its row.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, tuple_

from .db import transaction
from .models import CalibratorRow, CloudEventHalfRow
from .repository import Sessions, hold_calibrator
from .sql import insert_for

_OTHER = {"request": "response", "response": "request"}


@dataclass
class Exchanged:
    #: (calibrator id, event id) -> the other half's scores (None for a request): pairs to log.
    paired: dict[tuple[int, str], Any] = field(default_factory=dict)
    #: Halves stored, to wait for their other half.
    stored: int = 0
    #: Halves whose id holds the same half already (sent again, to another process).
    duplicates: int = 0
    #: Rows deleted for age, by half.
    expired: Counter = field(default_factory=Counter)
    #: Halves not stored because their calibrator was deleted meanwhile, by half.
    orphaned: Counter = field(default_factory=Counter)


def exchange(sessions: Sessions, halves: list[dict[str, Any]], expire_before: datetime | None) -> Exchanged:
    """In one transaction: store ``halves`` ({calibrator_id, event_id, half, scores, received_at}),
    or take the other half of an id that has a row; and delete rows received before ``expire_before``."""
    result = Exchanged()
    # One order for every process: two processes inserting each other's ids in opposite orders would
    # each wait for the other's uncommitted key (PostgreSQL then aborts one, and its batch with it).
    halves = sorted(halves, key=lambda h: (h["calibrator_id"], h["event_id"]))
    with transaction(sessions) as session:
        table = CloudEventHalfRow.__table__
        if halves:  # a calibrator deleted since a half came takes its halves with it
            ids = sorted({h["calibrator_id"] for h in halves})
            for calibrator_id in ids:  # and none is deleted between this check and the insert
                hold_calibrator(session, calibrator_id)
            alive = set(session.scalars(select(CalibratorRow.id).where(CalibratorRow.id.in_(ids))))
            result.orphaned = Counter(h["half"] for h in halves if h["calibrator_id"] not in alive)
            halves = [h for h in halves if h["calibrator_id"] in alive]
        if halves:
            statement = (
                insert_for(session)(table)
                .on_conflict_do_nothing(index_elements=["calibrator_id", "event_id"])
                .returning(table.c.calibrator_id, table.c.event_id)
            )
            stored = {tuple(row) for row in session.execute(statement, halves)}
            result.stored = len(stored)
            conflicts = [h for h in halves if (h["calibrator_id"], h["event_id"]) not in stored]
            if conflicts:
                wanted = [(h["calibrator_id"], h["event_id"], _OTHER[h["half"]]) for h in conflicts]
                rows = session.execute(
                    delete(table)
                    .where(tuple_(table.c.calibrator_id, table.c.event_id, table.c.half).in_(wanted))
                    .returning(table.c.calibrator_id, table.c.event_id, table.c.scores)
                ).all()
                result.paired = {(row[0], row[1]): row[2] for row in rows}
                result.duplicates = len(conflicts) - len(rows)
        if expire_before is not None:
            expired = session.execute(
                delete(table).where(table.c.received_at < expire_before).returning(table.c.half)
            ).scalars()
            result.expired = Counter(expired)
    return result
