"""Initial schema: arms, decisions, rewards, checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the four tables and their indexes."""
    op.create_table(
        "arms",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("slot", sa.Integer, nullable=False, unique=True),
        sa.Column("features", sa.JSON, nullable=True),
        sa.Column("active", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "decisions",
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("context", sa.JSON, nullable=False),
        sa.Column("candidates", sa.JSON, nullable=False),
        sa.Column("arm_id", sa.String(128), nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("propensity", sa.Float, nullable=False),
        sa.Column("model_version", sa.Integer, nullable=False),
        sa.Column("explore", sa.Boolean, nullable=False),
        sa.Column("policy", sa.String(32), nullable=False),
        sa.Column("scores", sa.JSON, nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("trained_in", sa.Integer, nullable=True),
    )
    op.create_index("ix_decisions_untrained", "decisions", ["trained_in", "created_at"])
    op.create_table(
        "rewards",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "event_id",
            sa.String(128),
            sa.ForeignKey("decisions.event_id"),
            nullable=False,
            unique=True,
        ),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("repeats", sa.Integer, nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("blob", sa.LargeBinary, nullable=True),
        sa.Column("path", sa.String(1024), nullable=True),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("rows_trained", sa.Integer, nullable=False),
        sa.Column("n_total", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    """Drop everything `upgrade` created, dependents first."""
    op.drop_table("checkpoints")
    op.drop_table("rewards")
    op.drop_index("ix_decisions_untrained", table_name="decisions")
    op.drop_table("decisions")
    op.drop_table("arms")
