"""Domain operations on the tables. Each runs in its own transaction and either commits
completely or changes nothing; database outages surface as `Unavailable`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, and_, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, defer

from rofu.service.db import faults
from rofu.service.db.engine import SessionFactory
from rofu.service.db.locking import lock_decisions
from rofu.service.db.tables import (
    HOLDOUT,
    PROMOTED,
    CheckpointRow,
    DecisionRow,
    ModelPinRow,
    RewardRow,
    utcnow,
)
from rofu.service.errors import Conflict, NotFound

T = TypeVar("T")


@contextmanager
def database_errors() -> Iterator[None]:
    """Turn database outages (refused, lost, timed out, locked, full, read-only) into
    `Unavailable` (HTTP 503) naming the cause; integrity and programming errors pass."""
    try:
        yield
    except (DBAPIError, PoolTimeout) as exc:
        if not faults.is_outage(exc):
            raise
        raise faults.as_unavailable(exc) from exc


def transaction(sessions: SessionFactory, work: Callable[[Session], T]) -> T:
    """`work` in one transaction: committed whole or not at all; an outage as `Unavailable`."""
    with database_errors(), sessions() as session, session.begin():
        return work(session)


# Decisions ---------------------------------------------------------------------------


def find_decision(sessions: SessionFactory, event_id: str) -> DecisionRow | None:
    """The stored decision of an event, if any."""
    return transaction(sessions, lambda s: s.get(DecisionRow, event_id))


def find_decisions(sessions: SessionFactory, event_ids: Collection[str]) -> dict[str, DecisionRow]:
    """The stored decisions of these events (one query), by event id."""

    def work(session: Session) -> dict[str, DecisionRow]:
        query = select(DecisionRow).where(DecisionRow.event_id.in_(list(event_ids)))
        return {row.event_id: row for row in session.scalars(query)}

    return transaction(sessions, work)


def insert_decisions(sessions: SessionFactory, rows: Sequence[DecisionRow]) -> None:
    """Insert decisions with distinct event ids in one transaction: all of them or none.

    Raises:
        IntegrityError: an event id is already stored; nothing was inserted.
        Unavailable: the database is down.
    """
    transaction(sessions, lambda s: s.add_all(rows))


def save_decision(sessions: SessionFactory, row: DecisionRow) -> tuple[DecisionRow, bool]:
    """Insert a decision; if its event id won a race elsewhere, return that one instead.

    Returns:
        (the stored decision, whether this call created it)
    """
    try:
        transaction(sessions, lambda s: s.add(row))
    except IntegrityError:
        existing = find_decision(sessions, row.event_id)
        if existing is None:  # the conflicting row vanished: nothing sane to return
            raise
        return existing, False
    return row, True


# Rewards (stored by `rofu.service.db.rewards`) ------------------------------------------


def misses_training(decision: DecisionRow, window_seconds: float) -> bool:
    """Whether a reward (or an activation) arriving now misses its decision's training."""
    if decision.trained_in is not None:
        return True
    closed = decision.created_at + timedelta(seconds=window_seconds)
    return window_seconds > 0 and utcnow() > closed


# Checkpoints and training rows ---------------------------------------------------------


def latest_checkpoint(sessions: SessionFactory, *, with_blob: bool = True) -> CheckpointRow | None:
    """The newest durable checkpoint that is promoted (`rofu.service.db.gate_status`) and
    not quarantined: the one replicas serve unpinned, and the trainer continues."""

    def work(session: Session) -> CheckpointRow | None:
        query = (
            select(CheckpointRow)
            .where(CheckpointRow.quarantined_at.is_(None), CheckpointRow.gate_status == PROMOTED)
            .order_by(CheckpointRow.version.desc())
            .limit(1)
        )
        if not with_blob:
            query = query.options(defer(CheckpointRow.blob))
        return session.scalar(query)

    return transaction(sessions, work)


def get_checkpoint(
    sessions: SessionFactory, version: int, *, with_blob: bool = True
) -> CheckpointRow | None:
    """A durable checkpoint by version."""
    if with_blob:
        return transaction(sessions, lambda s: s.get(CheckpointRow, version))
    query = (
        select(CheckpointRow)
        .where(CheckpointRow.version == version)
        .options(defer(CheckpointRow.blob))
    )
    return transaction(sessions, lambda s: s.scalar(query))


def checkpoint_blob_size(
    sessions: SessionFactory, version: int
) -> tuple[int | None, str | None] | None:
    """(the bytes of the blob in a checkpoint's row, its file's path), read without the
    blob, each None where absent; None when no such checkpoint is stored."""
    query = select(func.length(CheckpointRow.blob), CheckpointRow.path).where(
        CheckpointRow.version == version
    )
    found = transaction(sessions, lambda s: s.execute(query).first())
    return None if found is None else (found[0], found[1])


def list_checkpoints(
    sessions: SessionFactory, limit: int = 50, before: int | None = None
) -> list[CheckpointRow]:
    """Checkpoint metadata, newest first (blobs not loaded); only versions below `before`."""

    def work(session: Session) -> list[CheckpointRow]:
        query = (
            select(CheckpointRow)
            .options(defer(CheckpointRow.blob))
            .order_by(CheckpointRow.version.desc())
            .limit(limit)
        )
        if before is not None:
            query = query.where(CheckpointRow.version < before)
        return list(session.scalars(query))

    return transaction(sessions, work)


@dataclass(frozen=True)
class TrainingRow:
    """A decision whose reward window has closed, with its reward if one arrived.
    `active`: False for a deferred decision not activated in time (never trained on)."""

    event_id: str
    context: list[float]
    slot: int
    reward: float | None
    created_at: datetime
    active: bool = True
    arm_features: list[float] | None = None  # the chosen arm's per-request features
    held_out: bool = False  # served by a holdout's control: consumed, never trained on


def closed_decisions(
    sessions: SessionFactory, closed_before: datetime, limit: int
) -> list[TrainingRow]:
    """Untrained decisions made before `closed_before`, oldest first, each with its
    reward unless that is late (a late reward is never trained on) and whether it is
    active (a deferred decision not activated in time is not: `DecisionRow.active`)."""

    def work(session: Session) -> list[TrainingRow]:
        on_time = and_(RewardRow.event_id == DecisionRow.event_id, RewardRow.late.is_(False))
        query = (
            select(DecisionRow, RewardRow.value)
            .outerjoin(RewardRow, on_time)
            .where(DecisionRow.trained_in.is_(None), DecisionRow.created_at <= closed_before)
            .order_by(DecisionRow.created_at, DecisionRow.event_id)
            .limit(limit)
        )
        return [
            TrainingRow(
                d.event_id,
                list(d.context),
                d.slot,
                value,
                d.created_at,
                d.active,
                None if d.arm_features is None else d.arm_features.get(d.arm_id),
                d.experiment == HOLDOUT,
            )
            for d, value in session.execute(query)
        ]

    return transaction(sessions, work)


class ClaimLost(Conflict):
    """A training run's rows or base were taken by another trainer; nothing was stored."""


def commit_checkpoint(
    sessions: SessionFactory,
    row: CheckpointRow,
    consumed: Sequence[str],
    *,
    newest: int | None = None,
    parent: int | None = None,
    unrewarded: Sequence[str] = (),
) -> None:
    """Record a checkpoint and claim the decisions it consumed, in one transaction.

    The claim comes first, so on SQLite the transaction holds the write lock before it
    reads anything. With `newest`, the newest stored version must still be that one; with
    `parent`, that checkpoint must still be unquarantined (its row is locked on Postgres).
    `unrewarded`: the consumed decisions the run read without a reward; one that has
    a reward by now got it during the run, so it is marked late (never trained on).

    Raises:
        ClaimLost: a decision was consumed already, or another checkpoint was stored or
            the parent quarantined since the run read them; nothing was stored.
    """

    def work(session: Session) -> None:
        _claim(session, consumed, row.version, unrewarded)
        stored = session.scalar(select(func.max(CheckpointRow.version)))
        if newest is not None and (stored or 0) != newest:
            raise ClaimLost(f"checkpoint {stored} was stored since this run read {newest}")
        if parent:
            base = select(CheckpointRow.quarantined_at).where(CheckpointRow.version == parent)
            if session.execute(base.with_for_update()).scalar() is not None:
                raise ClaimLost(f"checkpoint {parent}, this run's base, was quarantined")
        session.add(row)

    try:
        transaction(sessions, work)
    except IntegrityError as exc:  # the version key: another trainer stored it first
        raise ClaimLost(f"checkpoint {row.version} is stored already") from exc


def mark_consumed(
    sessions: SessionFactory,
    consumed: Sequence[str],
    version: int,
    unrewarded: Sequence[str] = (),
) -> None:
    """Claim decisions as consumed by `version` without storing a checkpoint (rewards of
    `unrewarded` stored meanwhile become late, as in `commit_checkpoint`).

    Raises:
        ClaimLost: a decision was consumed already; none was marked.
    """

    transaction(sessions, lambda session: _claim(session, consumed, version, unrewarded))


def _claim(
    session: Session, consumed: Sequence[str], version: int, unrewarded: Sequence[str]
) -> None:
    """Mark the decisions consumed, then flag late the rewards that arrived for
    `unrewarded` ones since the run read them. A reward post locks its decision
    (`rofu.service.db.rewards`), so it either waits for this claim and sees it, or committed
    before the second statement here, which then sees the reward. The decisions are locked first,
    in the lock order of a batch of rewards (`rofu.service.db.locking`): no deadlock with one."""
    lock_decisions(session, consumed)
    claimed = 0
    for start in range(0, len(consumed), 500):
        chunk = list(consumed[start : start + 500])
        result = session.execute(
            update(DecisionRow)
            .where(DecisionRow.event_id.in_(chunk), DecisionRow.trained_in.is_(None))
            .values(trained_in=version)
        )
        claimed += cast(CursorResult[Any], result).rowcount
    if claimed != len(consumed):
        raise ClaimLost(
            f"{len(consumed) - claimed} of {len(consumed)} decisions were consumed by "
            "another training run"
        )
    for start in range(0, len(unrewarded), 500):
        chunk = list(unrewarded[start : start + 500])
        session.execute(
            update(RewardRow)
            .where(RewardRow.event_id.in_(chunk), RewardRow.late.is_(False))
            .values(late=True)
        )


# The model pin --------------------------------------------------------------------------


def get_pin(sessions: SessionFactory) -> int | None:
    """The pinned checkpoint version, or None when the newest is served."""

    def work(session: Session) -> int | None:
        row = session.get(ModelPinRow, 1)
        return None if row is None else row.version

    return transaction(sessions, work)


def set_pin(sessions: SessionFactory, version: int | None) -> None:
    """Pin a stored checkpoint version (None: unpin, serve the newest).

    Raises:
        NotFound: no checkpoint has that version.
        Conflict: that checkpoint is quarantined.
    """

    def work(session: Session) -> None:
        stored = None if version is None else session.get(CheckpointRow, version)
        if version is not None and stored is None:
            raise NotFound(f"no checkpoint with version {version}", field="version")
        if stored is not None and stored.quarantined_at is not None:
            raise Conflict(
                f"checkpoint {version} is quarantined ({stored.quarantine_reason})",
                field="version",
            )
        row = session.get(ModelPinRow, 1)
        if row is None:
            session.add(ModelPinRow(id=1, version=version, updated_at=utcnow()))
        else:
            row.version, row.updated_at = version, utcnow()

    transaction(sessions, work)
