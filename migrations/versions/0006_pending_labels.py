"""Labels that arrive before their prediction is stored; one label per prediction; request digests for idempotency keys.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER keys only


def upgrade() -> None:
    op.create_table(
        "pending_labels",
        sa.Column("id", ID, primary_key=True),
        sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), nullable=False),
        sa.Column("prediction_id", sa.String(128), nullable=False),
        sa.Column("label", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("unmatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("calibrator_id", "prediction_id", name="uq_pending_labels_calibrator_prediction"),
    )
    op.create_index("ix_pending_labels_received_at", "pending_labels", ["received_at"])
    # First label wins: a database that already holds a prediction labelled twice keeps its first label.
    op.execute(
        "DELETE FROM feedback WHERE prediction_id IS NOT NULL AND id NOT IN "
        "(SELECT min(id) FROM feedback WHERE prediction_id IS NOT NULL GROUP BY calibrator_id, prediction_id)"
    )
    op.create_index(
        "uq_feedback_calibrator_prediction", "feedback", ["calibrator_id", "prediction_id"], unique=True
    )
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.add_column(sa.Column("request_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.drop_column("request_sha256")
    op.drop_index("uq_feedback_calibrator_prediction", table_name="feedback")
    op.drop_table("pending_labels")
