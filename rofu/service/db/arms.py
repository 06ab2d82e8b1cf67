"""The arm catalogue's rows: list, add in the next free slot, retire, and add the configured
arms. Each runs in its own transaction (`rofu.service.db.repository.transaction`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import transaction
from rofu.service.db.tables import ArmRow, utcnow
from rofu.service.errors import Conflict, NotFound


def list_arms(sessions: SessionFactory) -> list[ArmRow]:
    """Every arm, active and retired, by slot."""
    return transaction(sessions, lambda s: list(s.scalars(select(ArmRow).order_by(ArmRow.slot))))


def add_arm(
    sessions: SessionFactory, arm_id: str, features: list[float] | None, max_arms: int
) -> ArmRow:
    """Add an arm in the next free slot; refuses a duplicate id or a full catalogue."""

    def work(session: Session) -> ArmRow:
        if session.get(ArmRow, arm_id) is not None:
            raise Conflict(f"arm {arm_id!r} already exists", field="id")
        highest = session.scalar(select(func.max(ArmRow.slot)))
        slot = 0 if highest is None else highest + 1
        if slot >= max_arms:
            raise Conflict(f"the catalogue is full (max_arms={max_arms})", field="id")
        row = ArmRow(id=arm_id, slot=slot, features=features, active=True)
        session.add(row)
        session.flush()
        return row

    for attempt in range(3):
        try:
            return transaction(sessions, work)
        except IntegrityError:  # a concurrent add took the same slot or id; retry
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def retire_arm(sessions: SessionFactory, arm_id: str) -> ArmRow:
    """Retire an arm for good; retiring it again is a no-op."""

    def work(session: Session) -> ArmRow:
        row = session.get(ArmRow, arm_id)
        if row is None:
            raise NotFound(f"no arm {arm_id!r}", field="id")
        if row.active:
            row.active = False
            row.retired_at = utcnow()
        return row

    return transaction(sessions, work)


def ensure_arms(
    sessions: SessionFactory, specs: Sequence[tuple[str, list[float] | None]], max_arms: int
) -> None:
    """Add the configured arms that the catalogue does not hold yet."""
    known = {row.id for row in list_arms(sessions)}
    for arm_id, features in specs:
        if arm_id not in known:
            try:
                add_arm(sessions, arm_id, features, max_arms)
            except Conflict:
                if arm_id not in {row.id for row in list_arms(sessions)}:
                    raise  # a full catalogue, not a concurrent add of the same arm
