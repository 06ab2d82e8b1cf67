"""Named features and per-request arm features on decisions.

`decisions.named_context` keeps a request's named features as validated (the `context`
column keeps the hashed vector the model read); `decisions.arm_features` maps each
candidate given per-request arm features to the vector it was scored with, which the
trainer trains the chosen arm on. Both are NULL on every existing row (dense contexts,
catalogue features).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the two nullable JSON columns."""
    op.add_column("decisions", sa.Column("named_context", sa.JSON, nullable=True))
    op.add_column("decisions", sa.Column("arm_features", sa.JSON, nullable=True))


def downgrade() -> None:
    """Drop both columns (the named contexts and per-request arm features are lost; the
    hashed contexts stay). A plain ALTER TABLE ... DROP COLUMN, as 0004's downgrade."""
    op.drop_column("decisions", "arm_features")
    op.drop_column("decisions", "named_context")
