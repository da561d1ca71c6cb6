"""Feedback rows without a foreign key to their calibrator.

PostgreSQL checks a foreign key by a trigger per inserted row: for a 5,000-row
batch of feedback that was most of the COPY's time. A feedback write now holds
its calibrator once (a shared advisory lock), and deleting a calibrator takes
that lock alone first and deletes its feedback itself, so no row is left
without its calibrator (repository ``hold_calibrator``, ``delete_calibrator``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# SQLite's constraint has no name: batch mode names it by this convention to drop it.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("feedback_calibrator_id_fkey", "feedback", type_="foreignkey")
    else:
        with op.batch_alter_table("feedback", naming_convention=NAMING) as batch:
            batch.drop_constraint("fk_feedback_calibrator_id_calibrators", type_="foreignkey")


def downgrade() -> None:
    # Rows of calibrators deleted meanwhile would break the constraint: none exist (see above).
    with op.batch_alter_table("feedback") as batch:
        batch.create_foreign_key("feedback_calibrator_id_fkey", "calibrators", ["calibrator_id"], ["id"], ondelete="CASCADE")
