"""Alembic environment: migrations run on the engine calibd passes in, or on
CALIBD_DATABASE_URL when alembic is run by hand (``alembic upgrade head``)."""

from alembic import context

from calibd.config import Settings
from calibd.storage.db import make_engine
from calibd.storage.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    engine = config.attributes.get("engine") or make_engine(Settings().database_url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


run_migrations()
