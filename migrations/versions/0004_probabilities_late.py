"""Exact choice probabilities on decisions; late rewards.

`decisions.probabilities` holds, per candidate and in the order of `candidates`, the
probability with which the selection rule picked it (the chosen arm's equals
`propensity`); rows logged before this revision keep NULL. `rewards.late` marks a reward
that arrived after its decision's window closed or after a checkpoint consumed the
decision: stored, never trained on. Existing rewards are not late. The index on
(created_at, event_id) serves the decision log's keyset pages (`rofu export`,
`GET /v1/decisions`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the nullable probabilities column, the late flag (false for every row) and the
    decision log's index."""
    op.add_column("decisions", sa.Column("probabilities", sa.JSON, nullable=True))
    op.add_column(
        "rewards",
        sa.Column("late", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_decisions_log_order", "decisions", ["created_at", "event_id"])


def downgrade() -> None:
    """Drop both columns (the probabilities and late flags are lost). A plain
    ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): rebuilding `decisions` in batch mode
    would drop a table that `rewards` references."""
    op.drop_index("ix_decisions_log_order", table_name="decisions")
    op.drop_column("rewards", "late")
    op.drop_column("decisions", "probabilities")
