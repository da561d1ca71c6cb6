"""Label timing: a label window per calibrator, prediction times on feedback, and maturity.

A calibrator declares how long after a prediction its label can still arrive
(``label_window_seconds``; null: labels are final on arrival) and what a
logged prediction without a label is at the end of its window
(``label_missing``: negative or unlabelled). Feedback rows keep the time of
their prediction (``predicted_at``) and whether they wait for maturity
(``waiting``, with the segment values they will be monitored under). ``label_maturity`` holds each windowed calibrator's cursor (every
prediction served up to ``matured_through`` is mature) and its counters;
``label_delays`` a small histogram of label delays per label value.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calibrators") as batch:
        batch.add_column(sa.Column("label_window_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("label_missing", sa.String(16), nullable=False, server_default="negative"))
    with op.batch_alter_table("feedback") as batch:
        batch.add_column(sa.Column("predicted_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("waiting", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("segments", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True))
    # Rows stored before prediction times were kept: their receipt is the best time known.
    op.execute("UPDATE feedback SET predicted_at = received_at")
    # The count windows read the newest mature rows by prediction time; maturity reads waiting rows by it.
    op.create_index("ix_feedback_calibrator_version_predicted", "feedback", ["calibrator_id", "version", "predicted_at"])
    op.create_index(
        "ix_feedback_waiting", "feedback", ["calibrator_id", "predicted_at"],
        postgresql_where=sa.text("waiting"), sqlite_where=sa.text("waiting"),
    )
    op.create_index("ix_predictions_calibrator_created", "predictions", ["calibrator_id", "created_at"])
    op.create_table(
        "label_maturity",
        sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("matured_through", sa.DateTime(timezone=True), nullable=False),
        sa.Column("late_labels", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("implied_negatives", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("unlabelled", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "label_delays",
        sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("label", sa.Integer(), primary_key=True),
        sa.Column("bin", sa.Integer(), primary_key=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("label_delays")
    op.drop_table("label_maturity")
    op.drop_index("ix_predictions_calibrator_created", table_name="predictions")
    op.drop_index("ix_feedback_waiting", table_name="feedback")
    op.drop_index("ix_feedback_calibrator_version_predicted", table_name="feedback")
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("segments")
        batch.drop_column("waiting")
        batch.drop_column("predicted_at")
    with op.batch_alter_table("calibrators") as batch:
        batch.drop_column("label_missing")
        batch.drop_column("label_window_seconds")
