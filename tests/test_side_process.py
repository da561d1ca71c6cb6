"""Side processes (the maturity step, the /metrics read) open the serving process's database by its
URL: an in-memory SQLite database, however it is written, is this process's alone, and its work stays
in this process."""

from __future__ import annotations

import pytest

from calibd.workers.side_process import shares_database


@pytest.mark.parametrize(
    ("url", "shared"),
    [
        ("sqlite://", False),
        ("sqlite:///:memory:", False),
        ("sqlite+pysqlite:///:memory:", False),
        ("sqlite:///file:calibd?mode=memory&cache=shared&uri=true", False),
        ("sqlite:///file::memory:?cache=shared&uri=true", False),
        ("sqlite:///calibd.db", True),
        ("sqlite:////tmp/calibd.db", True),
        ("sqlite:///file:calibd.db?mode=rwc&uri=true", True),
        ("postgresql+psycopg://postgres@127.0.0.1:5432/test", True),
    ],
)
def test_an_in_memory_sqlite_database_is_not_shared(url, shared):
    assert shares_database(url) is shared
