"""ROFU_DECISION_DURABILITY: `process` stores /select's decisions through an engine whose
commits are not flushed (SQLite synchronous=NORMAL), while rewards, activations and
checkpoints keep the flushed one (synchronous=FULL); `flush` (the default) uses one engine."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, event

from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client

BODY = {"context": [0.1, 0.2, 0.3, 0.4]}


def _synchronous(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.exec_driver_sql("PRAGMA synchronous").scalar_one())


def _inserts(engine: Engine) -> list[str]:
    """The tables each INSERT on `engine` writes, as they happen."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO"):
            seen.append(statement.split()[2])

    event.listen(engine, "before_cursor_execute", record)
    return seen


@pytest.mark.anyio
async def test_process_durability_stores_decisions_unflushed_and_rewards_flushed(
    sqlite_settings: Settings,
):
    settings = sqlite_settings.model_copy(update={"decision_durability": "process"})
    async with app_client(settings) as (client, app):
        runtime: Runtime = app.state.runtime
        assert runtime.decision_engine is not runtime.engine
        assert (_synchronous(runtime.decision_engine), _synchronous(runtime.engine)) == (1, 2)
        unflushed, flushed = _inserts(runtime.decision_engine), _inserts(runtime.engine)
        chosen = await client.post("/v1/select", json=BODY)
        event_id = chosen.json()["event_id"]
        rewarded = await client.post("/v1/reward", json={"event_id": event_id, "value": 1.0})
        again = await client.post("/v1/select", json={**BODY, "event_id": event_id})
    assert rewarded.status_code == 200, rewarded.text  # the main engine sees the decision
    assert again.json()["arm"] == chosen.json()["arm"]  # and so does the replay lookup
    assert unflushed == ["decisions"]
    assert flushed == ["rewards"]


@pytest.mark.anyio
async def test_flush_durability_is_one_flushed_engine(sqlite_settings: Settings):
    async with app_client(sqlite_settings) as (client, app):
        runtime: Runtime = app.state.runtime
        assert sqlite_settings.decision_durability == "flush"
        assert runtime.decision_engine is runtime.engine
        assert _synchronous(runtime.engine) == 2
        assert (await client.post("/v1/select", json=BODY)).status_code == 200


def test_decision_durability_refuses_an_unknown_value(sqlite_settings: Settings):
    with pytest.raises(ValueError, match="decision_durability"):
        Settings(database_url=sqlite_settings.database_url, decision_durability="sometimes")
