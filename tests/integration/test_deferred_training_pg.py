"""Deferred decisions on the real Postgres: the trainer trains only on those activated in
time, and an activation during a run (row locks, not SQLite's one writer) leaves its
decision to the next run."""

from __future__ import annotations

import pytest

from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.bus import InProcessBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.settings import Settings
from tests.deferrals import only_activated_decisions_are_trained_on


def test_trainer_trains_only_on_deferred_decisions_activated_in_time_on_postgres(
    pg_clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        database_url=pg_clean,
        context_dim=4,
        hidden=(8,),
        reward_window_seconds=0.0,
        fit_steps=20,
    )
    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        store = CheckpointStore(sessions)
        only_activated_decisions_are_trained_on(
            settings, sessions, store, InProcessBus(), monkeypatch
        )
    finally:
        engine.dispose()
