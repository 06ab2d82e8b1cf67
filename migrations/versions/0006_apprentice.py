"""Apprentice mode: the app's baseline arm, and rofu's own choice beside a served baseline.

`decisions.baseline_arm` holds the `baseline_arm` a /select request carried (either
mode). On a decision of apprentice mode, which served the baseline with probability 1,
`rofu_arm` and `rofu_probabilities` hold what rofu's rule would have chosen and each
candidate's probability under it (in `candidates` order). Existing rows keep NULL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = ("baseline_arm", "rofu_arm", "rofu_probabilities")


def upgrade() -> None:
    """Add the three nullable columns."""
    op.add_column("decisions", sa.Column("baseline_arm", sa.String(128), nullable=True))
    op.add_column("decisions", sa.Column("rofu_arm", sa.String(128), nullable=True))
    op.add_column("decisions", sa.Column("rofu_probabilities", sa.JSON, nullable=True))


def downgrade() -> None:
    """Drop them (the baselines and rofu's unserved choices are lost). A plain
    ALTER TABLE ... DROP COLUMN, as in 0004: `rewards` references `decisions`."""
    for column in reversed(COLUMNS):
        op.drop_column("decisions", column)
