"""Repository operations on the real Postgres, each test inside a rolled-back transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.db import repository
from service.db.tables import CheckpointRow, DecisionRow, utcnow
from service.errors import Conflict, NotFound
from tests.factories import decision_row


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
    first = repository.attach_reward(pg_sessions, "e-3", 2.5)
    repeat = repository.attach_reward(pg_sessions, "e-3", 2.5)
    assert (first.duplicate, repeat.duplicate, repeat.value) == (False, True, 2.5)
    with pytest.raises(Conflict, match="already has reward 2.5"):
        repository.attach_reward(pg_sessions, "e-3", 1.0)
    with pytest.raises(NotFound, match="e-404"):
        repository.attach_reward(pg_sessions, "e-404", 1.0)
    assert repository.count_rewards(pg_sessions) == 1


def test_repository_arms_take_fresh_slots_and_retire(pg_sessions):
    repository.ensure_arms(pg_sessions, [("x", None), ("y", None)], max_arms=3)
    repository.ensure_arms(pg_sessions, [("x", None), ("y", None)], max_arms=3)  # idempotent
    z = repository.add_arm(pg_sessions, "z", None, max_arms=3)
    assert [a.slot for a in repository.list_arms(pg_sessions)] == [0, 1, 2]
    assert z.slot == 2
    with pytest.raises(Conflict, match="full"):
        repository.add_arm(pg_sessions, "w", None, max_arms=3)
    with pytest.raises(Conflict, match="already exists"):
        repository.add_arm(pg_sessions, "x", None, max_arms=5)
    retired = repository.retire_arm(pg_sessions, "y")
    assert not retired.active
    assert retired.retired_at is not None
    assert repository.retire_arm(pg_sessions, "y").retired_at == retired.retired_at
    with pytest.raises(NotFound):
        repository.retire_arm(pg_sessions, "nope")


def test_repository_closed_decisions_and_checkpoint_commit_mark_rows(pg_sessions):
    for i in range(4):
        repository.save_decision(pg_sessions, _decision(f"t-{i}"))
    repository.attach_reward(pg_sessions, "t-1", 1.0)
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
