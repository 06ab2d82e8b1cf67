"""Rewards in the database: a batch of posts stored in one transaction, each with the
outcome or error it would get posted alone (`attach_rewards`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rofu.service.db.engine import SessionFactory
from rofu.service.db.locking import in_lock_order
from rofu.service.db.repository import database_errors, misses_training
from rofu.service.db.tables import DecisionRow, RewardRow
from rofu.service.errors import Conflict, NotFound


@dataclass(frozen=True)
class RewardPost:
    """One reward to store: the value posted for an event. `keep_first`: a different value
    for an event already rewarded is ignored (counted as a repeat) rather than refused."""

    event_id: str
    value: float
    keep_first: bool = False
    metrics: dict[str, float] | None = None  # guardrail metrics, stored with the value


@dataclass(frozen=True)
class RewardOutcome:
    """What /reward reports: the stored value, whether this post was a repeat, and
    whether the stored reward is late (never trained on); and the decision it joins.
    `ignored`: a repeat whose different value was not used (`RewardPost.keep_first`)."""

    event_id: str
    value: float
    duplicate: bool
    late: bool
    decision: DecisionRow | None = None
    ignored: bool = False


Stored = RewardOutcome | NotFound | Conflict  # a post's outcome, or its own error


def attach_rewards(
    sessions: SessionFactory, posts: Sequence[RewardPost], window_seconds: float = 0.0
) -> list[Stored]:
    """Store the rewards of decisions in one transaction, as if posted one after the other
    in this order; durable once this returns.

    The first value wins: a repeat with the same value is counted as a duplicate (never
    a second reward); a repeat with a different value gets `Conflict`, or, for a post that
    `keep_first`, is counted as an ignored duplicate (the row's `repeats`). A first reward
    is stored `late` when its decision was already consumed by a checkpoint, or when
    more than `window_seconds` (> 0) have passed since the decision: the trainer never
    trains on it. (With a window of 0 the trainer takes a decision at its next run, and
    a reward is late only once that run consumed it.)

    Returns:
        Per post, in order: its outcome, `NotFound` (no decision has its event id) or
        `Conflict` (its event already has a different reward).

    Raises:
        Unavailable: the database is down; no post was stored.
    """
    for attempt in range(2):
        try:
            with database_errors(), sessions() as session, session.begin():
                return _attach(session, posts, window_seconds)
        except IntegrityError:  # a concurrent first reward committed between our read and write
            if attempt:
                raise
    raise AssertionError("unreachable")


def attach_reward(
    sessions: SessionFactory, event_id: str, value: float, window_seconds: float = 0.0
) -> RewardOutcome:
    """Store the reward of a decision (`attach_rewards` of one post).

    Raises:
        NotFound: no decision has this event id.
        Conflict: the event already has a different reward.
    """
    [stored] = attach_rewards(sessions, [RewardPost(event_id, value)], window_seconds)
    if isinstance(stored, Exception):
        raise stored
    return stored


def _attach(session: Session, posts: Sequence[RewardPost], window_seconds: float) -> list[Stored]:
    # Locked (Postgres) so that a trainer's claim on a decision either comes first, and
    # is seen here, or waits and then sees this reward (`_claim`).
    locking = in_lock_order(session, {post.event_id for post in posts})
    decisions = {row.event_id: row for query in locking for row in session.scalars(query)}
    query = select(RewardRow).where(RewardRow.event_id.in_(list(decisions)))
    rewards = {row.event_id: row for row in session.scalars(query)}
    repeats: Counter[str] = Counter()
    results: list[Stored] = []
    for post in posts:
        decision = decisions.get(post.event_id)
        if decision is None:
            results.append(
                NotFound(f"no decision with event_id {post.event_id!r}", field="event_id")
            )
        elif post.event_id not in rewards:
            late = misses_training(decision, window_seconds)
            rewards[post.event_id] = RewardRow(
                event_id=post.event_id, value=post.value, late=late, metrics=post.metrics
            )
            session.add(rewards[post.event_id])
            results.append(RewardOutcome(post.event_id, post.value, False, late, decision))
        else:
            results.append(_repeat(rewards[post.event_id], post, repeats))
    session.flush()  # a first reward stored meanwhile by another replica fails here
    for event_id, count in repeats.items():
        session.execute(
            update(RewardRow)
            .where(RewardRow.event_id == event_id)
            .values(repeats=RewardRow.repeats + count)
        )
    return results


def _repeat(stored: RewardRow, post: RewardPost, repeats: Counter[str]) -> Stored:
    """A post for an event whose reward is stored: a duplicate (its value and metrics
    ignored if they differ and the post `keep_first`), or a `Conflict`."""
    differs = stored.value != post.value or (stored.metrics or None) != (post.metrics or None)
    if differs and not post.keep_first:
        what = "reward" if stored.value != post.value else "metrics for its reward"
        shown = stored.value if stored.value != post.value else stored.metrics
        return Conflict(
            f"event {post.event_id!r} already has {what} {shown}; the first value wins",
            field="value" if stored.value != post.value else "metrics",
        )
    repeats[post.event_id] += 1
    return RewardOutcome(
        post.event_id, stored.value, duplicate=True, late=stored.late, ignored=differs
    )


def count_rewards(sessions: SessionFactory) -> int:
    """Number of stored rewards."""
    with database_errors(), sessions() as session, session.begin():
        return session.scalar(select(func.count(RewardRow.id))) or 0
