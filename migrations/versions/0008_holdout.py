"""The holdout and guardrail metrics.

`decisions.experiment` records the group a decision was assigned to while a holdout ran
("rofu" or "holdout") and `decisions.unit_id` the request's unit it was assigned by;
`rewards.metrics` keeps the guardrail metrics an app reports with a reward. All three are
NULL on every existing row (no holdout ran, no metrics were reported).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the three nullable columns, and an index for the report's per-group reads."""
    op.add_column("decisions", sa.Column("experiment", sa.String(16), nullable=True))
    op.add_column("decisions", sa.Column("unit_id", sa.String(128), nullable=True))
    op.add_column("rewards", sa.Column("metrics", sa.JSON, nullable=True))
    op.create_index("ix_decisions_experiment", "decisions", ["experiment", "created_at"])


def downgrade() -> None:
    """Drop them (the groups, units and guardrail metrics are lost; the decisions and
    rewards stay). A plain ALTER TABLE ... DROP COLUMN, as 0004's downgrade."""
    op.drop_index("ix_decisions_experiment", table_name="decisions")
    op.drop_column("rewards", "metrics")
    op.drop_column("decisions", "unit_id")
    op.drop_column("decisions", "experiment")
