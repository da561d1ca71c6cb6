"""Segments: declared dimensions, tracked values, per-segment monitor sums, labelled rows and drift tests.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def _calibrator() -> sa.Column:
    return sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "segment_declarations",
        sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("dimensions", JSON, nullable=False),
        sa.Column("max_values", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "segment_values",
        _calibrator(),
        sa.Column("dimension", sa.String(64), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("calibrator_id", "dimension", "value"),
    )
    op.create_table(
        "segment_monitor_buckets",
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dimension", sa.String(64), nullable=False),
        sa.Column("segment", sa.String(256), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("bin", sa.Integer(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("sum_probability", sa.Float(), nullable=False),
        sa.Column("sum_label", sa.Float(), nullable=False),
        sa.Column("sum_brier", sa.Float(), nullable=False),
        sa.Column("sum_log_loss", sa.Float(), nullable=False),
        sa.Column("sum_accepted", sa.BigInteger(), nullable=False),
        sa.Column("count_with_acceptance", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("calibrator_id", "version", "dimension", "segment", "bucket_start", "bin"),
    )
    op.create_table(
        "segment_feedback",
        sa.Column("id", ID, primary_key=True),
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dimension", sa.String(64), nullable=False),
        sa.Column("segment", sa.String(256), nullable=False),
        sa.Column("probability", sa.Float(), nullable=False),
        sa.Column("label", sa.Integer(), nullable=False),
        sa.Column("probabilities", JSON, nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_segment_feedback_segment", "segment_feedback", ["calibrator_id", "version", "dimension", "segment", "id"]
    )
    op.create_index("ix_segment_feedback_received_at", "segment_feedback", ["received_at"])
    op.create_table(
        "segment_drift_state",
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dimension", sa.String(64), nullable=False),
        sa.Column("segment", sa.String(256), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("alarm", sa.Boolean(), nullable=False),
        sa.Column("log_evalue", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("calibrator_id", "version", "dimension", "segment"),
    )
    with op.batch_alter_table("predictions") as batch:
        batch.add_column(sa.Column("segments", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("predictions") as batch:
        batch.drop_column("segments")
    op.drop_table("segment_drift_state")
    op.drop_index("ix_segment_feedback_received_at", table_name="segment_feedback")
    op.drop_index("ix_segment_feedback_segment", table_name="segment_feedback")
    op.drop_table("segment_feedback")
    op.drop_table("segment_monitor_buckets")
    op.drop_table("segment_values")
    op.drop_table("segment_declarations")
