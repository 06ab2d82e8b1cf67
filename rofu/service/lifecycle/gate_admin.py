"""An operator's evaluation-gate decisions: promote or reject a stored checkpoint by hand
(`rofu promote` / `rofu reject`, `PUT /v1/admin/checkpoints/{version}`).

Promoting makes a checkpoint servable: replicas serve the newest promoted one unpinned,
and the trainer continues from it; an older one promoted by hand can then be pinned.
Rejecting takes one out of service: if it is served, replicas go back to the newest
promoted one. Refused, changing nothing: an unknown or quarantined version, rejecting
the pinned checkpoint (unpin first) or the only promoted one (nothing would be left to
serve), and a decision raced by another one. The figures record the operator, the
reason and the status and figures it replaced.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import func, select

from rofu.service.db import gate_status, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import PROMOTED, REJECTED, CheckpointRow
from rofu.service.errors import Conflict, NotFound
from rofu.service.lifecycle.redis_bus import RedisBus, send_notice

log = logging.getLogger("rofu.gate")
GATE_NOTICE = "gate"  # the bus notice after a decision by hand: replicas sync
STATUSES = (PROMOTED, REJECTED)


def decide(
    sessions: SessionFactory,
    version: int,
    status: str,
    reason: str | None = None,
    bus: RedisBus | None = None,
) -> CheckpointRow:
    """Promote or reject stored checkpoint `version` by hand; returns its row after.

    Raises:
        NotFound: no stored checkpoint has that version.
        Conflict: it is quarantined, pinned or the only promoted one (rejecting), or
            another decision changed it meanwhile.
    """
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    row = repository.get_checkpoint(sessions, version, with_blob=False)
    if row is None:
        raise NotFound(f"no checkpoint with version {version}", field="version")
    if row.quarantined_at is not None:
        raise Conflict(f"checkpoint {version} is quarantined: {row.quarantine_reason}")
    if row.gate_status == status:
        return row  # already so: nothing to change
    if status == REJECTED:
        _check_rejectable(sessions, version)
    figures = {
        "reason": reason or f"{status} by hand",
        "at": datetime.now(UTC).isoformat(),
        "by": "operator",
        "replaced": {"status": row.gate_status, "gate": row.gate},
    }
    if not gate_status.mark(sessions, version, status, figures, was=row.gate_status):
        raise Conflict(f"checkpoint {version} was decided meanwhile: look again and retry")
    log.warning("checkpoint %s %s by an operator: %s", version, status, figures["reason"])
    send_notice(bus, GATE_NOTICE, "gate")
    found = repository.get_checkpoint(sessions, version, with_blob=False)
    assert found is not None  # checkpoints are never deleted
    return found


def _check_rejectable(sessions: SessionFactory, version: int) -> None:
    if repository.get_pin(sessions) == version:
        raise Conflict(f"checkpoint {version} is pinned: unpin it first (rofu unpin)")
    others = select(func.count()).where(
        CheckpointRow.version != version,
        CheckpointRow.gate_status == PROMOTED,
        CheckpointRow.quarantined_at.is_(None),
    )
    if not repository.transaction(sessions, lambda s: s.scalar(others)):
        raise Conflict(
            f"checkpoint {version} is the only promoted checkpoint: rejecting it would leave "
            "nothing to serve (promote another first)"
        )
