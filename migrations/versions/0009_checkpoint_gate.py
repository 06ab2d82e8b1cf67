"""The evaluation gate's state of each checkpoint.

`checkpoints.gate_status` is `candidate` (stored, not served: the trainer's gate has not
decided), `promoted` (may be served) or `rejected` (kept, never served unless promoted
by hand); `checkpoints.gate` holds the figures the decision rested on (both estimates,
their intervals, the rows, the tolerance, the reason, when and by whom). Every existing
checkpoint was served as soon as it was stored: it becomes `promoted`, with no figures.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the status (existing rows promoted) and the nullable JSON figures."""
    op.add_column(
        "checkpoints",
        sa.Column("gate_status", sa.String(16), nullable=False, server_default="promoted"),
    )
    op.add_column("checkpoints", sa.Column("gate", sa.JSON, nullable=True))


def downgrade() -> None:
    """Drop both columns. Candidates and rejected checkpoints stay stored and, without
    the gate, become servable: the newest one is served (delete them first to avoid it)."""
    op.drop_column("checkpoints", "gate")
    op.drop_column("checkpoints", "gate_status")
