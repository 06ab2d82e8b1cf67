"""The one order in which every transaction that locks several decisions takes them (a
batch of rewards, a training run's claim, an expiry of unactivated decisions): by the
event ids' bytes. Two such transactions then never wait for each other."""

from __future__ import annotations

from collections.abc import Collection, Iterator

from sqlalchemy import Select, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import ColumnElement

from rofu.service.db.tables import DecisionRow

LOCK_CHUNK = 4096  # ids per locking query: the largest ROFU_BATCH_MAX_SIZE, so a batch takes one


def in_lock_order(session: Session, event_ids: Collection[str]) -> Iterator[Select[DecisionRow]]:
    """Queries that select the decisions of `event_ids` and lock them (Postgres; SQLite
    ignores `FOR UPDATE`) in the one order every transaction locking several decisions
    takes them: by the ids' bytes, `LOCK_CHUNK` to a query. So no two such transactions
    can wait for each other (a deadlock)."""
    key: ColumnElement[str] = DecisionRow.event_id.expression
    if session.get_bind().dialect.name == "postgresql":
        key = key.collate("C")  # Python's order of the ids, whatever the database's collation
    ids = sorted(set(event_ids))
    for start in range(0, len(ids), LOCK_CHUNK):
        chunk = ids[start : start + LOCK_CHUNK]
        query = select(DecisionRow).where(DecisionRow.event_id.in_(chunk))
        yield query.order_by(key).with_for_update()


def lock_decisions(session: Session, event_ids: Collection[str]) -> None:
    """Lock the decisions of `event_ids` in the lock order (`in_lock_order`) before a
    statement that updates several of them. Postgres only: SQLite has no row locks, and a
    claim's first statement there must be its write (`commit_checkpoint`)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    for query in in_lock_order(session, event_ids):
        session.execute(query.with_only_columns(DecisionRow.event_id)).all()
