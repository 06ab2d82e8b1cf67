"""Late rewards on SQLite: a reward after its decision's window closed, or after a
checkpoint consumed the decision, is stored flagged `late`, counted as its own outcome,
said so in the response, and never trained on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text, update

from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.tables import DecisionRow, utcnow
from rofu.service.lifecycle.trainer import Trainer, TrainReport
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client

CONTEXT = [0.5, -0.25, 1.0, 0.0]
Service = tuple[httpx.AsyncClient, FastAPI]


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


@pytest.fixture
async def windowed(sqlite_settings: Settings) -> AsyncIterator[Service]:
    """The API with a 60 s reward window."""
    settings = sqlite_settings.model_copy(update={"reward_window_seconds": 60.0})
    async with app_client(settings) as pair:
        yield pair


async def _decide(client: httpx.AsyncClient, event_id: str) -> None:
    body = {"context": CONTEXT, "event_id": event_id}
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text


async def _reward(client: httpx.AsyncClient, event_id: str, value: float) -> dict[str, Any]:
    response = await client.post("/v1/reward", json={"event_id": event_id, "value": value})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _age(app: FastAPI, event_id: str, seconds: float) -> None:
    """Make a stored decision `seconds` old."""
    with _runtime(app).sessions() as session, session.begin():
        session.execute(
            update(DecisionRow)
            .where(DecisionRow.event_id == event_id)
            .values(created_at=utcnow() - timedelta(seconds=seconds))
        )


def _late_flags(app: FastAPI) -> dict[str, bool]:
    with _runtime(app).engine.connect() as connection:
        rows = connection.execute(text("select event_id, late from rewards")).all()
    return {event_id: bool(late) for event_id, late in rows}


async def _outcomes(client: httpx.AsyncClient) -> dict[str, float]:
    body = (await client.get("/metrics")).text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "rofu_rewards_total"
    }


async def _train(app: FastAPI, **update: Any) -> TrainReport | None:
    runtime = _runtime(app)
    settings = runtime.settings.model_copy(update=update)
    trainer = Trainer(settings, runtime.sessions, runtime.store, runtime.local_bus)
    return await anyio.to_thread.run_sync(trainer.run_once)


@pytest.mark.anyio
async def test_late_reward_after_the_window_is_stored_flagged_and_counted(
    windowed: Service,
) -> None:
    client, app = windowed
    await _decide(client, "on-time")
    await _decide(client, "late-1")
    _age(app, "late-1", 61.0)
    assert (await _reward(client, "on-time", 1.0))["late"] is False
    late = await _reward(client, "late-1", 1.0)
    assert late == {"event_id": "late-1", "value": 1.0, "duplicate": False, "late": True}
    repeat = await _reward(client, "late-1", 1.0)  # idempotent: a repeat is a duplicate
    assert repeat == {"event_id": "late-1", "value": 1.0, "duplicate": True, "late": True}
    conflict = await client.post("/v1/reward", json={"event_id": "late-1", "value": 0.0})
    assert conflict.status_code == 409
    assert _late_flags(app) == {"on-time": False, "late-1": True}
    outcomes = await _outcomes(client)
    assert outcomes["late"] == 1
    assert outcomes["accepted"] == 1
    assert outcomes["duplicate"] == 1


@pytest.mark.anyio
async def test_late_reward_after_the_window_is_never_trained_on(windowed: Service) -> None:
    client, app = windowed
    for event_id in ("a", "b"):
        await _decide(client, event_id)
        _age(app, event_id, 120.0)
    await _reward(client, "a", 1.0)  # late: its window closed a minute ago
    report = await _train(app, default_reward=None)  # the trainer's window is 60 s too
    assert report is not None
    assert (report.consumed, report.rewarded, report.excluded) == (2, 0, 2)
    report = await _train(app, default_reward=0.0)
    assert report is None  # consumed: nothing left to train on


@pytest.mark.anyio
async def test_late_reward_for_a_consumed_decision(sqlite_settings: Settings) -> None:
    """With a window of 0 the trainer takes a decision at its next run; a reward after
    that run is late, one before it is trained on."""
    async with app_client(sqlite_settings) as (client, app):
        await _decide(client, "early")
        await _decide(client, "consumed")
        assert (await _reward(client, "early", 1.0))["late"] is False
        report = await _train(app)
        assert report is not None
        assert (report.consumed, report.rewarded, report.excluded) == (2, 1, 1)
        late = await _reward(client, "consumed", 1.0)
        assert late["late"] is True
        assert (await _outcomes(client))["late"] == 1
        assert await _train(app) is None
    assert _late_flags(app) == {"early": False, "consumed": True}


def test_late_reward_posted_during_a_training_run_is_flagged_at_the_claim(
    sqlite_settings: Settings,
) -> None:
    """A reward stored after the run read its decision (without one), but before the run
    claimed it: the claim flags it late, since the run did not train on it."""
    from rofu.service import migrate
    from rofu.service.db.engine import make_engine, session_factory
    from tests.factories import decision_row

    migrate.upgrade(sqlite_settings.database_url)
    engine = make_engine(sqlite_settings.database_url)
    sessions = session_factory(engine)
    try:
        repository.insert_decisions(
            sessions, [decision_row("read-bare", [0.0] * 4), decision_row("read-paid", [0.0] * 4)]
        )
        reward_rows.attach_reward(sessions, "read-paid", 1.0)
        rows = repository.closed_decisions(sessions, utcnow(), 10)
        assert {row.event_id: row.reward for row in rows} == {"read-bare": None, "read-paid": 1.0}
        during = reward_rows.attach_reward(sessions, "read-bare", 2.0)
        assert during.late is False  # nothing consumed it yet
        unrewarded = [row.event_id for row in rows if row.reward is None]
        repository.mark_consumed(sessions, [row.event_id for row in rows], 1, unrewarded)
        with engine.connect() as connection:
            flags = dict(connection.execute(text("select event_id, late from rewards")).all())
        assert {k: bool(v) for k, v in flags.items()} == {"read-bare": True, "read-paid": False}
        again = reward_rows.attach_reward(sessions, "read-bare", 2.0)
        assert (again.duplicate, again.late) == (True, True)
    finally:
        engine.dispose()
