"""The evaluation gate's state of each checkpoint (`checkpoints.gate_status`, 0008).

A checkpoint is stored `promoted` (servable: the gate is off, or nothing is served yet)
or `candidate` (the trainer's gate decides later); a decision moves a candidate to
`promoted` or `rejected`, and an operator may move any unquarantined checkpoint either
way (`rofu.service.lifecycle.gate_admin`). Replicas serve, and the trainer continues, the
newest promoted one (`repository.latest_checkpoint`).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import defer

from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import transaction
from rofu.service.db.tables import CANDIDATE, CheckpointRow


def pending(sessions: SessionFactory) -> CheckpointRow | None:
    """The newest unquarantined candidate (blob not loaded), if any."""
    query = (
        select(CheckpointRow)
        .options(defer(CheckpointRow.blob))
        .where(CheckpointRow.gate_status == CANDIDATE, CheckpointRow.quarantined_at.is_(None))
        .order_by(CheckpointRow.version.desc())
        .limit(1)
    )
    return transaction(sessions, lambda s: s.scalar(query))


def mark(
    sessions: SessionFactory,
    version: int,
    status: str,
    figures: dict[str, Any],
    *,
    was: str | None = None,
) -> bool:
    """Set checkpoint `version`'s status and figures (only if its status is still `was`,
    when given: a decision raced by another one changes nothing). Returns whether it did."""
    query = update(CheckpointRow).where(CheckpointRow.version == version)
    if was is not None:
        query = query.where(CheckpointRow.gate_status == was)
    query = query.values(gate_status=status, gate=figures)
    done = transaction(sessions, lambda s: cast(CursorResult[Any], s.execute(query)).rowcount)
    return bool(done)
