"""The API on the real Postgres: decisions and rewards land in the tables, exactly once."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from service.settings import Settings
from tests.support import app_client


def _settings(url: str) -> Settings:
    return Settings(
        database_url=url,
        context_dim=3,
        hidden=(8,),
        embedded_trainer=False,
        reward_window_seconds=0.0,
    )


def _rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as connection:
        return connection.execute(query).fetchall()


@pytest.mark.anyio
async def test_api_select_writes_a_decision_and_reward_attaches(pg_clean):
    async with app_client(_settings(pg_clean)) as (client, _):
        chosen = await client.post("/select", json={"context": [0.1, 0.2, 0.3], "event_id": "pg-1"})
        assert chosen.status_code == 200
        decision = _rows(
            pg_clean,
            "select arm_id, propensity, model_version, context, policy "
            "from decisions where event_id = 'pg-1'",
        )
        assert decision == [(chosen.json()["arm"], 0.25, 0, [0.1, 0.2, 0.3], "cold-start")]
        reward = await client.post("/reward", json={"event_id": "pg-1", "value": 0.75})
        assert reward.json() == {"event_id": "pg-1", "value": 0.75, "duplicate": False}
        assert _rows(pg_clean, "select event_id, value, repeats from rewards") == [
            ("pg-1", 0.75, 0)
        ]


@pytest.mark.anyio
async def test_api_concurrent_duplicate_rewards_do_not_double_count(pg_clean):
    async with app_client(_settings(pg_clean)) as (client, _):
        await client.post("/select", json={"context": [1.0, 0.0, 0.0], "event_id": "pg-dup"})
        posts = [
            client.post("/reward", json={"event_id": "pg-dup", "value": 1.0}) for _ in range(24)
        ]
        responses = await asyncio.gather(*posts)
    assert [r.status_code for r in responses] == [200] * 24
    assert sum(not r.json()["duplicate"] for r in responses) == 1
    assert _rows(pg_clean, "select count(*), sum(value), max(repeats) from rewards") == [
        (1, 1.0, 23)
    ]


@pytest.mark.anyio
async def test_api_concurrent_same_event_id_gives_one_decision(pg_clean):
    body = {"context": [0.0, 1.0, 0.0], "event_id": "pg-same"}
    async with app_client(_settings(pg_clean)) as (client, _):
        responses = await asyncio.gather(*[client.post("/select", json=body) for _ in range(16)])
    assert {r.status_code for r in responses} == {200}
    assert len({(r.json()["arm"], r.json()["propensity"]) for r in responses}) == 1
    assert _rows(pg_clean, "select count(*) from decisions") == [(1,)]


@pytest.mark.anyio
async def test_api_conflicting_concurrent_rewards_keep_one_value(pg_clean):
    async with app_client(_settings(pg_clean)) as (client, _):
        await client.post("/select", json={"context": [1.0, 1.0, 0.0], "event_id": "pg-race"})
        posts = [
            client.post("/reward", json={"event_id": "pg-race", "value": float(v)})
            for v in range(8)
        ]
        responses = await asyncio.gather(*posts)
    accepted = [r for r in responses if r.status_code == 200]
    assert len(accepted) == 1
    assert sorted(r.status_code for r in responses) == [200] + [409] * 7
    stored = _rows(pg_clean, "select value from rewards where event_id = 'pg-race'")
    assert stored == [(accepted[0].json()["value"],)]
