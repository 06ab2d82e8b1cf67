"""Model pin: an operator can serve an earlier checkpoint (rollback) until unpinned.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the single-row pin table."""
    op.create_table(
        "model_pin",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("version", sa.Integer, sa.ForeignKey("checkpoints.version"), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_model_pin_single_row"),
    )


def downgrade() -> None:
    """Drop the pin table."""
    op.drop_table("model_pin")
