"""ROFU_DECISION_DURABILITY=process on the real Postgres: decisions commit with
synchronous_commit off, rewards with it on, and a reward finds its decision."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine

from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client


def _synchronous_commit(engine: Engine) -> str:
    with engine.connect() as connection:
        return str(connection.exec_driver_sql("SHOW synchronous_commit").scalar_one())


@pytest.mark.anyio
async def test_process_durability_on_postgres(pg_clean: str):
    settings = Settings(
        database_url=pg_clean,
        context_dim=3,
        hidden=(8,),
        embedded_trainer=False,
        reward_window_seconds=0.0,
        decision_durability="process",
    )
    async with app_client(settings) as (client, app):
        runtime: Runtime = app.state.runtime
        modes = _synchronous_commit(runtime.decision_engine), _synchronous_commit(runtime.engine)
        chosen = await client.post("/v1/select", json={"context": [0.1, 0.2, 0.3]})
        event_id = chosen.json()["event_id"]
        rewarded = await client.post("/v1/reward", json={"event_id": event_id, "value": 0.5})
    assert modes == ("off", "on")
    assert rewarded.status_code == 200, rewarded.text
    with psycopg.connect(pg_clean) as connection:
        stored = connection.execute(
            "select d.event_id, r.value from decisions d join rewards r using (event_id)"
        ).fetchall()
    assert stored == [(event_id, 0.5)]
