"""Activations racing a training run's expiry on the real Postgres, from two engines at once
(an API replica and the trainer): every deferred decision ends either activated in time
and left for the next run, or expired by the run with any activation of it late; never
both, never neither, and never a deadlock."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from rofu.service.db import deferral, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import DecisionRow
from tests.factories import decision_row
from tests.support import together

EVENTS = 60
ROUNDS = 6


def _deferred(sessions: SessionFactory, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i:03d}" for i in range(EVENTS)]
    rows: list[DecisionRow] = []
    for event_id in reversed(ids):  # stored against the lock order
        row = decision_row(event_id, [0.0])
        row.deferred = True
        rows.append(row)
    repository.insert_decisions(sessions, rows)
    return ids


def _state(sessions: SessionFactory, prefix: str) -> dict[str, tuple[int | None, bool, bool]]:
    """Per decision: (trained_in, activated, activation_late)."""
    query = text(
        "select event_id, trained_in, activated_at is not null, coalesce(activation_late, false)"
        " from decisions where event_id like :p"
    )
    with sessions() as session:
        rows = session.execute(query, {"p": f"{prefix}-%"}).all()
    return {event_id: (trained, activated, late) for event_id, trained, activated, late in rows}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_activations_racing_an_expiry_leave_every_decision_in_one_consistent_state(
    two_engines, round_: int
) -> None:
    api, trainer = two_engines
    prefix = f"r{round_}"
    ids = _deferred(api, prefix)
    order = list(ids)
    random.Random(round_).shuffle(order)  # the activations in no particular order
    activate = order[: EVENTS * 2 // 3]  # a third is never activated

    def activations() -> list[deferral.Activation]:
        return [deferral.activate_decision(api, event_id) for event_id in activate]

    expiring = list(reversed(ids)) if round_ % 2 else ids
    answers, expired = together(
        activations, lambda: deferral.expire_unactivated(trainer, expiring, version=7)
    )
    assert not isinstance(answers, Exception), f"round {round_}: {answers!r}"
    assert not isinstance(expired, Exception), f"round {round_}: {expired!r}"
    state = _state(api, prefix)
    assert sum(trained == 7 for trained, _, _ in state.values()) == expired
    said = {answer.event_id: answer for answer in answers}
    for event_id, (trained, activated, late) in state.items():
        if event_id not in said:  # never activated: the run expired it
            assert (trained, activated) == (7, False), event_id
            continue
        answer = said[event_id]
        assert activated, event_id
        assert answer.created, event_id
        assert late == answer.late, event_id
        if late:  # the run came first: expired, and the activation says so
            assert trained == 7, event_id
        else:  # the activation came first: left for the next run
            assert trained is None, event_id
