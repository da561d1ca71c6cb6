"""Calibrators, their immutable versions, and the registry generation counter.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "calibrators",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("uid", sa.String(32), nullable=False, unique=True),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("current_version", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "calibrator_versions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("input_kind", sa.String(16), nullable=False),
        sa.Column("n_classes", sa.Integer(), nullable=False),
        sa.Column("classes", JSON, nullable=True),
        sa.Column("parameters", JSON, nullable=False),
        sa.Column("summary", JSON, nullable=False),
        sa.Column("holdout_sha256", sa.String(64), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("fit_seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("calibrator_id", "version"),
    )
    op.create_index("ix_calibrator_versions_calibrator_id", "calibrator_versions", ["calibrator_id"])
    registry_state = op.create_table(
        "registry_state",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(registry_state, [{"id": 1, "generation": 0}])


def downgrade() -> None:
    op.drop_table("registry_state")
    op.drop_index("ix_calibrator_versions_calibrator_id", "calibrator_versions")
    op.drop_table("calibrator_versions")
    op.drop_table("calibrators")
