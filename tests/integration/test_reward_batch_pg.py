"""Batches of rewards on the real Postgres, from two "replicas" (two engines) at once: each
batch locks its decisions in one order, so batches over the same events in opposite
orders, or a batch and a trainer's claim, never deadlock; the first value wins once."""

from __future__ import annotations

import threading
from functools import partial

from sqlalchemy import text

from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory, make_engine, session_factory
from rofu.service.db.rewards import RewardOutcome, RewardPost, Stored
from rofu.service.errors import Conflict
from tests.factories import decision_row
from tests.support import together

EVENTS = [f"ev-{i:02d}" for i in range(12)]
ROUNDS = 8


def _decide(sessions: SessionFactory, prefix: str) -> list[str]:
    """This round's decisions, inserted in reverse order of their ids (a scan that
    follows the table then meets them in the opposite order to the lock order)."""
    ids = [f"{prefix}-{event_id}" for event_id in EVENTS]
    repository.insert_decisions(sessions, [decision_row(e, [0.0]) for e in reversed(ids)])
    return ids


def _rows(sessions: SessionFactory, prefix: str) -> dict[str, tuple[float, int, bool]]:
    query = text("select event_id, value, repeats, late from rewards where event_id like :p")
    with sessions() as session:
        rows = session.execute(query, {"p": f"{prefix}-%"}).all()
    return {event_id: (value, repeats, late) for event_id, value, repeats, late in rows}


def test_reward_batches_of_two_replicas_in_opposite_orders_never_deadlock(two_engines) -> None:
    one, two = two_engines
    for round_ in range(ROUNDS):
        ids = _decide(one, f"r{round_}")
        # replica one posts 1.0 to every event; two posts 1.0 to the even ones and 2.0 to
        # the odd ones, in the opposite order, and repeats its first post at the end
        first = [RewardPost(e, 1.0) for e in ids]
        second = [RewardPost(e, 1.0 + i % 2) for i, e in reversed(list(enumerate(ids)))]
        second.append(second[0])
        results = together(
            partial(reward_rows.attach_rewards, one, first),
            partial(reward_rows.attach_rewards, two, second),
        )
        assert not any(isinstance(r, Exception) for r in results), (round_, results)
        by_event: dict[str, list[Stored]] = {e: [] for e in ids}
        for posts, stored in zip((first, second), results, strict=True):
            for post, result in zip(posts, stored, strict=True):
                by_event[post.event_id].append(result)
        rows = _rows(one, f"r{round_}")
        assert set(rows) == set(ids)  # one reward per event, never two
        for event_id, outcomes in by_event.items():
            won = [o for o in outcomes if isinstance(o, RewardOutcome) and not o.duplicate]
            assert len(won) == 1, (round_, event_id, outcomes)  # exactly one first value
            value, repeats, _ = rows[event_id]
            assert value == won[0].value
            duplicates = [o for o in outcomes if isinstance(o, RewardOutcome) and o.duplicate]
            conflicts = [o for o in outcomes if isinstance(o, Conflict)]
            assert repeats == len(duplicates)
            assert all(o.value == value for o in duplicates)
            assert len(duplicates) + len(conflicts) == len(outcomes) - 1


def test_reward_batch_and_a_claim_in_opposite_orders_never_deadlock(two_engines) -> None:
    """The run read every decision without a reward: whichever commits first, each
    reward ends up late (stored after the claim, or flagged by it), and both succeed."""
    api, trainer = two_engines
    for round_ in range(ROUNDS):
        ids = _decide(api, f"c{round_}")
        posts = [RewardPost(e, 1.0) for e in ids]
        claimed = list(reversed(ids))
        results = together(
            partial(reward_rows.attach_rewards, api, posts),
            partial(repository.mark_consumed, trainer, claimed, 1, claimed),
        )
        assert not any(isinstance(r, Exception) for r in results), (round_, results)
        assert all(isinstance(r, RewardOutcome) and not r.duplicate for r in results[0])
        assert {late for _, _, late in _rows(api, f"c{round_}").values()} == {True}


def test_reward_batch_waiting_for_a_claim_sees_every_decision_it_consumed(pg_clean) -> None:
    engine = make_engine(pg_clean)
    sessions = session_factory(engine)
    try:
        repository.insert_decisions(sessions, [decision_row(e, [0.0]) for e in ("w-1", "w-2")])
        with engine.connect() as holder:
            claim = holder.begin()
            holder.execute(text("update decisions set trained_in = 1 where event_id = 'w-2'"))
            answers: list[list[Stored]] = []
            posts = [RewardPost("w-1", 1.0), RewardPost("w-2", 1.0)]
            worker = threading.Thread(
                target=lambda: answers.append(reward_rows.attach_rewards(sessions, posts))
            )
            worker.start()
            worker.join(0.5)
            assert worker.is_alive()  # waiting for w-2's row lock
            claim.commit()
            worker.join(10)
    finally:
        engine.dispose()
    [(on_time, late)] = answers
    assert isinstance(on_time, RewardOutcome)
    assert isinstance(late, RewardOutcome)
    assert (on_time.late, late.late) == (False, True)
