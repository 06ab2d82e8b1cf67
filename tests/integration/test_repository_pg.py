"""Repository operations on the real Postgres, each test inside a rolled-back transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from rofu.service.db import arms as arm_rows
from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.tables import CheckpointRow, DecisionRow, utcnow
from rofu.service.errors import Conflict, NotFound
from tests.factories import checkpoint_blob, decision_row


def _decision(event_id: str, arm: str = "a", slot: int = 0) -> DecisionRow:
    row = decision_row(
        event_id, [0.5, -1.0], arm=arm, slot=slot, candidates=["a", "b"], model_version=3
    )
    row.scores = {"a": [0.1, 0.2, 0.3], "b": [0.0, 0.1, 0.1]}
    return row


def test_repository_decision_round_trip(pg_sessions):
    saved, created = repository.save_decision(pg_sessions, _decision("e-1"))
    assert created
    stored = repository.find_decision(pg_sessions, "e-1")
    assert stored is not None
    assert (stored.context, stored.candidates, stored.arm_id, stored.model_version) == (
        [0.5, -1.0],
        ["a", "b"],
        "a",
        3,
    )
    assert stored.scores["a"] == [0.1, 0.2, 0.3]
    assert stored.created_at.tzinfo is not None


def test_repository_duplicate_decision_returns_the_first(pg_sessions):
    repository.save_decision(pg_sessions, _decision("e-2", arm="a"))
    again, created = repository.save_decision(pg_sessions, _decision("e-2", arm="b", slot=1))
    assert not created
    assert again.arm_id == "a"


def test_repository_reward_first_value_wins(pg_sessions):
    repository.save_decision(pg_sessions, _decision("e-3"))
    first = reward_rows.attach_reward(pg_sessions, "e-3", 2.5)
    repeat = reward_rows.attach_reward(pg_sessions, "e-3", 2.5)
    assert (first.duplicate, repeat.duplicate, repeat.value) == (False, True, 2.5)
    with pytest.raises(Conflict, match="already has reward 2.5"):
        reward_rows.attach_reward(pg_sessions, "e-3", 1.0)
    with pytest.raises(NotFound, match="e-404"):
        reward_rows.attach_reward(pg_sessions, "e-404", 1.0)
    assert reward_rows.count_rewards(pg_sessions) == 1


def test_repository_arms_take_fresh_slots_and_retire(pg_sessions):
    arm_rows.ensure_arms(pg_sessions, [("x", None), ("y", None)], max_arms=3)
    arm_rows.ensure_arms(pg_sessions, [("x", None), ("y", None)], max_arms=3)  # idempotent
    z = arm_rows.add_arm(pg_sessions, "z", None, max_arms=3)
    assert [a.slot for a in arm_rows.list_arms(pg_sessions)] == [0, 1, 2]
    assert z.slot == 2
    with pytest.raises(Conflict, match="full"):
        arm_rows.add_arm(pg_sessions, "w", None, max_arms=3)
    with pytest.raises(Conflict, match="already exists"):
        arm_rows.add_arm(pg_sessions, "x", None, max_arms=5)
    retired = arm_rows.retire_arm(pg_sessions, "y")
    assert not retired.active
    assert retired.retired_at is not None
    assert arm_rows.retire_arm(pg_sessions, "y").retired_at == retired.retired_at
    with pytest.raises(NotFound):
        arm_rows.retire_arm(pg_sessions, "nope")


def test_repository_closed_decisions_and_checkpoint_commit_mark_rows(pg_sessions):
    for i in range(4):
        repository.save_decision(pg_sessions, _decision(f"t-{i}"))
    reward_rows.attach_reward(pg_sessions, "t-1", 1.0)
    now = utcnow()
    assert repository.closed_decisions(pg_sessions, now - timedelta(hours=1), 10) == []
    rows = repository.closed_decisions(pg_sessions, now, 10)
    assert {r.event_id: r.reward for r in rows} == {
        f"t-{i}": (1.0 if i == 1 else None) for i in range(4)
    }
    checkpoint = CheckpointRow(
        version=1,
        checksum="c" * 64,
        size_bytes=3,
        blob=b"abc",
        path=None,
        metrics={},
        rows_trained=1,
        n_total=1,
    )
    repository.commit_checkpoint(pg_sessions, checkpoint, ["t-0", "t-1"])
    left = repository.closed_decisions(pg_sessions, utcnow(), 10)
    assert [r.event_id for r in left] == ["t-2", "t-3"]
    assert repository.latest_checkpoint(pg_sessions).version == 1


def test_repository_reward_for_a_consumed_decision_is_late(pg_sessions):
    repository.save_decision(pg_sessions, _decision("c-1"))
    repository.save_decision(pg_sessions, _decision("c-2"))
    repository.mark_consumed(pg_sessions, ["c-1"], 1)
    late = reward_rows.attach_reward(pg_sessions, "c-1", 1.0, window_seconds=60.0)
    on_time = reward_rows.attach_reward(pg_sessions, "c-2", 1.0, window_seconds=60.0)
    assert (late.late, on_time.late) == (True, False)
    assert [r.reward for r in repository.closed_decisions(pg_sessions, utcnow(), 10)] == [1.0]


def _lock_then(pg_url: str, first: str, then: Callable[[Any], None]) -> bool:
    """Open a transaction that does `first` (taking a decision's row lock), start `then`
    on another connection in a thread (it blocks on the lock), commit, and return the
    stored reward's late flag once `then` finished."""
    engine = make_engine(pg_url)
    sessions = session_factory(engine)
    try:
        repository.insert_decisions(sessions, [_decision("race")])
        with engine.connect() as holder:
            transaction = holder.begin()
            holder.execute(text(first))
            worker = threading.Thread(target=then, args=(sessions,))
            worker.start()
            worker.join(0.5)
            assert worker.is_alive()  # waiting for the row lock
            transaction.commit()
            worker.join(10)
        with engine.connect() as connection:
            return bool(connection.execute(text("select late from rewards")).scalar_one())
    finally:
        engine.dispose()


def test_repository_reward_waiting_for_a_claim_sees_it(pg_clean):
    """The claim locked the decision first: the post waits, then finds it consumed."""
    answers: list[bool] = []

    def post(sessions: Any) -> None:
        answers.append(reward_rows.attach_reward(sessions, "race", 1.0).late)

    claim = "update decisions set trained_in = 1 where event_id = 'race'"
    assert _lock_then(pg_clean, claim, post) is True
    assert answers == [True]


def test_repository_claim_waiting_for_a_reward_flags_it(pg_clean):
    """The post locked the decision first and stored its reward, unseen by the run that
    read the decision without one: the claim waits, then flags the reward late."""
    post = (
        "select event_id from decisions where event_id = 'race' for update;"
        " insert into rewards (event_id, value, received_at, repeats, late)"
        " values ('race', 1.0, now(), 0, false)"
    )

    def claim(sessions: Any) -> None:
        repository.mark_consumed(sessions, ["race"], 1, ["race"])

    assert _lock_then(pg_clean, post, claim) is True


def test_a_checkpoint_with_non_finite_metrics_commits_them_as_null(pg_sessions):
    """Postgres's JSON refuses NaN and Infinity: a run whose loss or gradient norm is not
    finite must still commit its checkpoint row, with those metrics null."""
    from rofu.service.lifecycle.checkpoint_store import CheckpointStore

    metrics = {"loss": float("nan"), "grad_norm": float("inf"), "steps": 3.0, "rows": 7.0}
    CheckpointStore(pg_sessions).save(
        1, checkpoint_blob(1), metrics=metrics, rows_trained=7, n_total=7, consumed=[]
    )
    stored = repository.get_checkpoint(pg_sessions, 1)
    assert stored is not None
    assert stored.metrics == {"loss": None, "grad_norm": None, "steps": 3.0, "rows": 7.0}
