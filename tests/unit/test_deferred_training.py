"""Deferred decisions on SQLite: the trainer trains only on those activated in time."""

from __future__ import annotations

import pytest

from rofu.service import migrate
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.bus import InProcessBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.settings import Settings
from tests.deferrals import only_activated_decisions_are_trained_on


def test_trainer_trains_only_on_deferred_decisions_activated_in_time(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(sqlite_settings.database_url)
    engine = make_engine(sqlite_settings.database_url)
    try:
        sessions = session_factory(engine)
        store = CheckpointStore(sessions)
        only_activated_decisions_are_trained_on(
            sqlite_settings, sessions, store, InProcessBus(), monkeypatch
        )
    finally:
        engine.dispose()
