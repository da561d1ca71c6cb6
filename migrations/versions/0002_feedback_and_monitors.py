"""Logged predictions, labelled feedback, monitor aggregates, drift state, idempotency keys.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only


def _calibrator() -> sa.Column:
    return sa.Column(
        "calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "predictions",
        sa.Column("id", ID, primary_key=True),
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("prediction_id", sa.String(128), nullable=False),
        sa.Column("probability", sa.Float(), nullable=True),
        sa.Column("probabilities", JSON, nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("calibrator_id", "prediction_id"),
    )
    op.create_index("ix_predictions_created_at", "predictions", ["created_at"])
    op.create_table(
        "feedback",
        sa.Column("id", ID, primary_key=True),
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("prediction_id", sa.String(128), nullable=True),
        sa.Column("probability", sa.Float(), nullable=False),
        sa.Column("label", sa.Integer(), nullable=False),
        sa.Column("probabilities", JSON, nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_feedback_received_at", "feedback", ["received_at"])
    op.create_index("ix_feedback_calibrator_version_id", "feedback", ["calibrator_id", "version", "id"])
    op.create_table(
        "monitor_buckets",
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("bin", sa.Integer(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("sum_probability", sa.Float(), nullable=False),
        sa.Column("sum_label", sa.Float(), nullable=False),
        sa.Column("sum_brier", sa.Float(), nullable=False),
        sa.Column("sum_log_loss", sa.Float(), nullable=False),
        sa.Column("sum_accepted", sa.BigInteger(), nullable=False),
        sa.Column("count_with_acceptance", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("calibrator_id", "version", "bucket_start", "bin"),
    )
    op.create_table(
        "drift_state",
        _calibrator(),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("alarm", sa.Boolean(), nullable=False),
        sa.Column("log_evalue", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("calibrator_id", "version"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(255), primary_key=True),
        _calibrator(),
        sa.Column("response", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_table("drift_state")
    op.drop_table("monitor_buckets")
    op.drop_table("feedback")
    op.drop_table("predictions")
