"""The API on the real Postgres: decisions and rewards land in the tables, exactly once."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from rofu.service.db import repository
from rofu.service.settings import Settings
from tests.support import Transactions, app_client


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
        chosen = await client.post(
            "/v1/select", json={"context": [0.1, 0.2, 0.3], "event_id": "pg-1"}
        )
        assert chosen.status_code == 200
        decision = _rows(
            pg_clean,
            "select arm_id, propensity, model_version, context, policy "
            "from decisions where event_id = 'pg-1'",
        )
        assert decision == [(chosen.json()["arm"], 0.25, 0, [0.1, 0.2, 0.3], "cold-start")]
        reward = await client.post("/v1/reward", json={"event_id": "pg-1", "value": 0.75})
        assert reward.json() == {
            "event_id": "pg-1",
            "value": 0.75,
            "duplicate": False,
            "late": False,
        }
        assert _rows(pg_clean, "select event_id, value, repeats from rewards") == [
            ("pg-1", 0.75, 0)
        ]


@pytest.mark.anyio
async def test_api_concurrent_duplicate_rewards_do_not_double_count(pg_clean):
    async with app_client(_settings(pg_clean)) as (client, _):
        await client.post("/v1/select", json={"context": [1.0, 0.0, 0.0], "event_id": "pg-dup"})
        posts = [
            client.post("/v1/reward", json={"event_id": "pg-dup", "value": 1.0}) for _ in range(24)
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
        responses = await asyncio.gather(*[client.post("/v1/select", json=body) for _ in range(16)])
    assert {r.status_code for r in responses} == {200}
    assert len({(r.json()["arm"], r.json()["propensity"]) for r in responses}) == 1
    assert _rows(pg_clean, "select count(*) from decisions") == [(1,)]


@pytest.mark.anyio
async def test_api_conflicting_concurrent_rewards_keep_one_value(pg_clean):
    async with app_client(_settings(pg_clean)) as (client, _):
        await client.post("/v1/select", json={"context": [1.0, 1.0, 0.0], "event_id": "pg-race"})
        posts = [
            client.post("/v1/reward", json={"event_id": "pg-race", "value": float(v)})
            for v in range(8)
        ]
        responses = await asyncio.gather(*posts)
    accepted = [r for r in responses if r.status_code == 200]
    assert len(accepted) == 1
    assert sorted(r.status_code for r in responses) == [200] + [409] * 7
    stored = _rows(pg_clean, "select value from rewards where event_id = 'pg-race'")
    assert stored == [(accepted[0].json()["value"],)]


def _batched(url: str, size: int) -> Settings:
    """Settings whose batches flush only when `size` requests wait (no background queries)."""
    return _settings(url).model_copy(
        update={
            "batch_max_size": size,
            "batch_max_wait_ms": 1000.0,
            "checkpoint_poll_seconds": 600,
            "arm_refresh_seconds": 600,
        }
    )


@pytest.mark.anyio
async def test_api_one_batch_of_selects_is_one_transaction(pg_clean):
    bodies = [{"context": [float(i), 0.0, 0.0]} for i in range(6)]
    bodies += [{"context": [0.5, 0.5, 0.5], "event_id": "pg-twice"}] * 2
    async with app_client(_batched(pg_clean, len(bodies))) as (client, app):
        tx = Transactions(app.state.runtime.engine)
        responses = await asyncio.gather(*(client.post("/v1/select", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * 8
    assert responses[6].json() == responses[7].json()
    assert tx.decision_writes() == ["commit"]
    assert tx.commits == 2  # the key lookup, then every decision of the batch
    assert _rows(pg_clean, "select count(*) from decisions") == [(7,)]


@pytest.mark.anyio
async def test_api_batch_settles_keys_stored_by_another_replica(pg_clean, monkeypatch):
    body = {"context": [1.0, 2.0, 3.0], "event_id": "pg-raced"}
    async with app_client(_batched(pg_clean, 4)) as (client, app):
        first = await asyncio.gather(*(client.post("/v1/select", json=body) for _ in range(4)))
        # The lookup misses, as when another replica stores the key after it ran.
        monkeypatch.setattr(repository, "find_decisions", lambda *_: {})
        tx = Transactions(app.state.runtime.engine)
        bodies = [body, {**body, "context": [0.0, 0.0, 0.0]}]
        bodies += [{"context": [float(i), 1.0, 1.0]} for i in range(2)]
        responses = await asyncio.gather(*(client.post("/v1/select", json=b) for b in bodies))
    assert {r.json()["event_id"] for r in first} == {"pg-raced"}
    assert [r.status_code for r in responses] == [200, 409, 200, 200]
    assert responses[0].json() == first[0].json()
    # the batch insert fails on the key; then row by row: the key's row loses, two commit
    assert tx.decision_writes() == ["rollback", "rollback", "commit", "commit"]
    assert _rows(pg_clean, "select count(*) from decisions") == [(3,)]


@pytest.mark.anyio
async def test_api_named_context_and_arm_features_land_in_their_columns(pg_clean):
    from rofu.service.deciding.features import featurize
    from rofu.service.settings import ArmSpec

    arms = [ArmSpec(id=f"arm-{i}", features=[float(i), 1.0]) for i in range(3)]
    settings = _settings(pg_clean).model_copy(update={"arm_feature_dim": 2, "arms": arms})
    named = {"user": {"age": 31, "tags": ["a", "b"]}, "mobile": True}
    body = {"context": named, "event_id": "pg-named", "arm_features": {"arm-2": {"p": 2}}}
    async with app_client(settings) as (client, _):
        chosen = await client.post("/v1/select", json=body)
        assert chosen.status_code == 200, chosen.text
        reordered = {"mobile": True, "user": {"tags": ["a", "b"], "age": 31.0}}
        again = await client.post("/v1/select", json={**body, "context": reordered})
        assert again.json() == chosen.json()
    assert _rows(
        pg_clean,
        "select context, named_context, arm_features from decisions where event_id = 'pg-named'",
    ) == [
        (
            featurize(named, 3, 0),
            {"user": {"age": 31.0, "tags": ["a", "b"]}, "mobile": True},
            {"arm-2": featurize({"p": 2}, 2, 0)},
        )
    ]
