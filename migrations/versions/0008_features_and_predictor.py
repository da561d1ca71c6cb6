"""Features kept with served predictions and their labels (refits of feature-taking methods), and a
calibrator's upstream predictor (transformer mode).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("predictions", sa.Column("features", JSON, nullable=True))
    op.add_column("feedback", sa.Column("features", JSON, nullable=True))
    op.add_column("calibrators", sa.Column("predictor", JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("calibrators", "predictor")
    op.drop_column("feedback", "features")
    op.drop_column("predictions", "features")
