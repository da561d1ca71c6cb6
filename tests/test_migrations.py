"""The migrations are the schema: they match the models, and go down and up again, on both databases."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from calibd.storage import migrate
from calibd.storage.db import make_engine
from calibd.storage.models import Base

from .conftest import migrated_database


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_migrations_match_the_models_and_round_trip(kind, tmp_path):
    with migrated_database(kind, tmp_path) as url:
        engine = make_engine(url)
        try:
            with engine.connect() as connection:
                differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            assert differences == [], differences
            assert migrate.is_at_head(engine)
            migrate.downgrade(engine, "base")
            assert migrate.current_revision(engine) is None
            migrate.upgrade(engine)
            assert migrate.current_revision(engine) == migrate.head_revision()
        finally:
            engine.dispose()
