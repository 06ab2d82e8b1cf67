"""Deferred activation of decisions.

`decisions.deferred` marks a decision logged with `"defer": true`: it is trained on and
evaluated only once `POST /v1/events/{id}/activate` activated it in time.
`decisions.activated_at` is the first activation's time (NULL: never activated, and for
every decision that was not deferred); `decisions.activation_late` marks an activation
that came after the decision's window closed or after the trainer consumed it: stored,
never trained on. Existing decisions are not deferred.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the deferred and activation_late flags (false for every row) and the nullable
    activation time."""
    op.add_column(
        "decisions",
        sa.Column("deferred", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.add_column("decisions", sa.Column("activated_at", sa.DateTime(timezone=True)))
    op.add_column(
        "decisions",
        sa.Column("activation_late", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    """Drop the three columns (which decisions were deferred or activated is lost). A plain
    ALTER TABLE ... DROP COLUMN (SQLite >= 3.35), as 0004 does: rebuilding `decisions` in
    batch mode would drop a table that `rewards` references."""
    op.drop_column("decisions", "activation_late")
    op.drop_column("decisions", "activated_at")
    op.drop_column("decisions", "deferred")
