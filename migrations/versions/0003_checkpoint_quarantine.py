"""Checkpoint quarantine and the trainer lease.

A checkpoint whose stored bytes are found damaged is quarantined (when and why), so that
neither the trainer nor a replica loads it again. `trainer_lease` is the lock that lets
exactly one trainer train at a time on SQLite (Postgres uses an advisory lock instead).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the quarantine columns and create the single-row lease table."""
    op.add_column("checkpoints", sa.Column("quarantined_at", sa.DateTime(timezone=True)))
    op.add_column("checkpoints", sa.Column("quarantine_reason", sa.String(1024)))
    op.create_table(
        "trainer_lease",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(256), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_trainer_lease_single_row"),
    )


def downgrade() -> None:
    """Drop the lease table and the quarantine columns (quarantined rows stay stored)."""
    op.drop_table("trainer_lease")
    with op.batch_alter_table("checkpoints") as batch:  # SQLite rebuilds the table
        batch.drop_column("quarantine_reason")
        batch.drop_column("quarantined_at")
