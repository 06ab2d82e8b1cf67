"""The deferred-activation trainer scenario, shared by the SQLite (unit) and Postgres
(integration) tests: only decisions activated in time are trained on."""

from __future__ import annotations

import pytest

from rofu.service.db import deferral, repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory
from rofu.service.lifecycle.bus import CheckpointBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.trainers import log_decisions, marks


def log_deferred(sessions: SessionFactory, event_id: str, reward: float) -> None:
    """A deferred decision and its reward (stored before any activation)."""
    row = decision_row(event_id, [0.5, 1.0, -1.0, 0.5], arm="arm-1", slot=1)
    row.deferred = True
    repository.save_decision(sessions, row)
    outcome = reward_rows.attach_reward(sessions, event_id, reward)
    assert not outcome.late


def only_activated_decisions_are_trained_on(
    settings: Settings,
    sessions: SessionFactory,
    store: CheckpointStore,
    bus: CheckpointBus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six plain decisions and three deferred ones, each rewarded: `shown` is activated
    before the run, `hidden` never, `raced` while the run trains. The run trains on the
    plain six and `shown`, expires `hidden` and leaves `raced` to the next run, which
    trains on it; `hidden` activated afterwards is late."""
    assert settings.reward_window_seconds == 0.0
    metrics = ServiceMetrics()
    trainer = Trainer(settings, sessions, store, bus, metrics)
    log_decisions(sessions, "plain", 6)
    for event_id in ("shown", "hidden", "raced"):
        log_deferred(sessions, event_id, 1.0)
    assert deferral.activate_decision(sessions, "shown").created
    real = repository.closed_decisions

    def activated_while_training(*args: object, **kwargs: object) -> list[repository.TrainingRow]:
        rows = real(*args, **kwargs)  # type: ignore[arg-type]
        assert {row.event_id for row in rows if not row.active} == {"hidden", "raced"}
        activation = deferral.activate_decision(sessions, "raced")
        assert (activation.created, activation.late) == (True, False)
        return rows

    monkeypatch.setattr(repository, "closed_decisions", activated_while_training)
    first = trainer.run_once()
    monkeypatch.setattr(repository, "closed_decisions", real)

    assert first is not None
    assert (first.version, first.rewarded, first.expired, first.consumed) == (1, 7, 1, 8)
    stored = repository.latest_checkpoint(sessions)
    assert stored is not None
    assert (stored.rows_trained, stored.n_total) == (7, 7)
    assert marks(sessions) == {1: 8, None: 1}  # `raced` waits for the next run
    late = deferral.activate_decision(sessions, "hidden")
    assert (late.created, late.late) == (True, True)

    second = trainer.run_once()
    assert second is not None
    assert (second.version, second.rewarded, second.expired, second.consumed) == (2, 1, 0, 1)
    assert repository.latest_checkpoint(sessions).n_total == 8  # type: ignore[union-attr]
    assert trainer.run_once() is None  # `hidden`'s late activation never brings it back
    assert metrics.deferred.labels("expired")._value.get() == 1
    assert metrics.trainer_rows.labels("rewarded")._value.get() == 8
