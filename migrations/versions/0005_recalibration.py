"""Raw scores with predictions and feedback; closed-loop recalibration policies and events.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _calibrator(primary_key: bool = False) -> sa.Column:
    return sa.Column(
        "calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"),
        nullable=False, primary_key=primary_key,
    )


def upgrade() -> None:
    with op.batch_alter_table("predictions") as batch:
        batch.add_column(sa.Column("scores", JSON, nullable=True))
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("scores", JSON, nullable=True))
    op.create_table(
        "recalibration",
        _calibrator(primary_key=True),
        sa.Column("policy", JSON, nullable=False),
        sa.Column("candidate_version", sa.Integer(), nullable=True),
        sa.Column("candidate_after_feedback_id", sa.BigInteger(), nullable=True),
        sa.Column("last_refit_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(32), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "recalibration_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        _calibrator(),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("candidate_version", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("details", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_recalibration_events_calibrator_id", "recalibration_events", ["calibrator_id"])


def downgrade() -> None:
    op.drop_table("recalibration_events")
    op.drop_table("recalibration")
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("scores")
    with op.batch_alter_table("predictions") as batch:
        batch.drop_column("scores")
