"""Deferred decisions in the database: activating one, and expiring those never activated.

A decision logged with `"defer": true` is trained on only once activated within its
window. The activation takes the same row lock as a reward (`rofu.service.db.rewards`):
a trainer's claim either came first, and the activation sees it and is late, or comes
after, and `expire_unactivated` leaves the activated decision for the next run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.orm import Session

from rofu.service.db.engine import SessionFactory
from rofu.service.db.locking import lock_decisions
from rofu.service.db.repository import database_errors, misses_training
from rofu.service.db.tables import DecisionRow, utcnow
from rofu.service.errors import NotFound


@dataclass(frozen=True)
class Activation:
    """What an activation did.

    Attributes:
        deferred: whether the decision was logged with `defer` (False: always active, so
            activating it changed nothing).
        activated_at: the first activation's time (None when not deferred).
        late: the first activation came after the decision's window closed or after the
            trainer consumed it: the decision is never trained on or evaluated.
        duplicate: an earlier activation was stored already; this one changed nothing.
    """

    event_id: str
    deferred: bool
    activated_at: datetime | None
    late: bool
    duplicate: bool

    @property
    def created(self) -> bool:
        """Whether this call stored the decision's activation."""
        return self.deferred and not self.duplicate


def activate_decision(
    sessions: SessionFactory, event_id: str, window_seconds: float = 0.0
) -> Activation:
    """Activate a deferred decision; durable once this returns, idempotent.

    An activation is late, as a reward is (`repository.misses_training`), when the
    trainer already consumed the decision or `window_seconds` (> 0) have passed since it.

    Raises:
        NotFound: no decision has this event id.
    """
    with database_errors(), sessions() as session, session.begin():
        return _activate(session, event_id, window_seconds)


def _activate(session: Session, event_id: str, window_seconds: float) -> Activation:
    decision = session.get(DecisionRow, event_id, with_for_update=True)
    if decision is None:
        raise NotFound(f"no decision with event_id {event_id!r}", field="event_id")
    if not decision.deferred:
        return Activation(event_id, False, None, late=False, duplicate=False)
    if decision.activated_at is not None:
        return Activation(
            event_id, True, decision.activated_at, decision.activation_late, duplicate=True
        )
    decision.activated_at = utcnow()
    decision.activation_late = misses_training(decision, window_seconds)
    return Activation(
        event_id, True, decision.activated_at, decision.activation_late, duplicate=False
    )


def expire_unactivated(sessions: SessionFactory, event_ids: Sequence[str], version: int) -> int:
    """Mark consumed by `version` the deferred decisions of `event_ids` that are still not
    activated in time (an activation after this is late). One activated since the
    trainer read it stays unconsumed, and the next run trains on it.

    Returns:
        How many decisions expired.
    """
    awaiting = or_(DecisionRow.activated_at.is_(None), DecisionRow.activation_late.is_(True))
    expired = 0
    with database_errors(), sessions() as session, session.begin():
        lock_decisions(session, event_ids)  # as a batch of rewards does: no deadlock
        for start in range(0, len(event_ids), 500):
            chunk = list(event_ids[start : start + 500])
            result = session.execute(
                update(DecisionRow)
                .where(
                    DecisionRow.event_id.in_(chunk),
                    DecisionRow.trained_in.is_(None),
                    DecisionRow.deferred.is_(True),
                    awaiting,
                )
                .values(trained_in=version)
            )
            expired += cast(CursorResult[Any], result).rowcount
    return expired
