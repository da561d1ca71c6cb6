"""Unpaired halves of KServe payload logger events, shared between processes.

POST /cloudevents pairs a request with its response by ce-id. A half left unpaired in a process
for CALIBD_CLOUDEVENTS_SHARE_SECONDS is written here, one row an id, so that its other half,
which reached another process (another replica or worker), pairs with it there.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cloudevent_halves",
        sa.Column("calibrator_id", sa.Integer(), sa.ForeignKey("calibrators.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("half", sa.String(8), nullable=False),
        sa.Column("scores", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_cloudevent_halves_received_at", "cloudevent_halves", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_cloudevent_halves_received_at", table_name="cloudevent_halves")
    op.drop_table("cloudevent_halves")
