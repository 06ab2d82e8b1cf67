"""The learning loop over real Redis and Postgres: train, store, publish, follow, pin."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import redis

from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.support import app_client, eventually, require_redis


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture
def settings(pg_clean, redis_url) -> Settings:
    return Settings(
        database_url=pg_clean,
        redis_url=redis_url,
        redis_prefix=f"test-{uuid.uuid4().hex[:10]}",
        context_dim=3,
        hidden=(8,),
        reward_window_seconds=0.0,
        fit_steps=20,
        checkpoint_poll_seconds=3600.0,  # swaps must come from the pub/sub notice
    )


@pytest.fixture
def trainer(settings):
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    bus = RedisBus(settings.redis_url, prefix=settings.redis_prefix)
    yield Trainer(settings, sessions, CheckpointStore(sessions), bus), sessions, bus
    bus.close()
    engine.dispose()


async def _decide_and_reward(client, n: int, prefix: str) -> None:
    for i in range(n):
        chosen = await client.post(
            "/v1/select", json={"context": [i / n, 1.0, -i / n], "event_id": f"{prefix}-{i}"}
        )
        assert chosen.status_code == 200
        await client.post("/v1/reward", json={"event_id": f"{prefix}-{i}", "value": i / n})


def _served(app) -> int:
    current = app.state.runtime.holder.current
    return 0 if current is None else current.version


@pytest.mark.anyio
async def test_trainer_run_reads_rows_stores_and_publishes(settings, trainer):
    run, sessions, bus = trainer
    async with app_client(settings) as (client, _):
        await _decide_and_reward(client, 12, "a")
    listener = redis.Redis.from_url(settings.redis_url).pubsub()
    listener.subscribe(bus.channel)
    listener.get_message(timeout=1)  # the subscribe confirmation

    report = run.run_once()

    assert (report.version, report.consumed, report.rewarded, report.excluded) == (1, 12, 12, 0)
    stored = repository.latest_checkpoint(sessions)
    assert (stored.version, stored.n_total, stored.rows_trained) == (1, 12, 12)
    assert bus.fetch(1) == stored.blob
    assert bus.latest_version() == 1
    notice = listener.get_message(timeout=5)
    assert notice is not None
    assert notice["data"] == b"1"
    assert repository.closed_decisions(sessions, stored.created_at, 100) == []
    assert run.run_once() is None  # nothing new: no empty checkpoint
    listener.close()


@pytest.mark.anyio
async def test_two_replicas_swap_to_the_new_version(settings, trainer):
    run = trainer[0]
    async with app_client(settings) as (first, app_a), app_client(settings) as (_, app_b):
        assert (_served(app_a), _served(app_b)) == (0, 0)
        await _decide_and_reward(first, 10, "b")
        run.run_once()
        await eventually(lambda: _served(app_a) == 1 and _served(app_b) == 1)
        await _decide_and_reward(first, 10, "c")
        run.run_once()
        await eventually(lambda: (_served(app_a), _served(app_b)) == (2, 2))
        chosen = (await first.post("/v1/select", json={"context": [0, 0, 1]})).json()
        assert (chosen["policy"], chosen["model_version"]) == ("rofu", 2)


@pytest.mark.anyio
async def test_a_checkpoint_only_on_the_bus_is_ignored_and_the_old_one_served(settings, trainer):
    run, _, bus = trainer
    async with app_client(settings) as (client, app):
        await _decide_and_reward(client, 10, "d")
        run.run_once()
        await eventually(lambda: _served(app) == 1)
        rejected = app.state.runtime.metrics.checkpoint_rejected.labels("unrecorded")
        good = bus.fetch(1)
        corrupted = bytearray(good)
        corrupted[len(corrupted) // 2] ^= 0xFF
        bus.publish(2, bytes(corrupted))  # only on the bus: the database does not vouch for it
        await eventually(lambda: rejected._value.get() >= 1)
        assert _served(app) == 1
        reply = await client.post("/v1/select", json={"context": [1, 2, 3]})
        assert (reply.status_code, reply.json()["model_version"]) == (200, 1)
        metrics = (await client.get("/metrics")).text
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith('rofu_checkpoint_rejected_total{reason="unrecorded"}')
        )
        assert float(line.split()[-1]) >= 1


@pytest.mark.anyio
async def test_a_corrupted_bus_copy_falls_back_to_the_durable_one(settings, trainer):
    run, _, bus = trainer
    async with app_client(settings) as (client, app):
        await _decide_and_reward(client, 8, "e")
        run.run_once()
        await eventually(lambda: _served(app) == 1)
        await _decide_and_reward(client, 8, "f")
        bad_bus = _TamperingBus(bus)
        run._bus = bad_bus
        run.run_once()  # stores v2 durably, publishes damaged bytes
        await eventually(lambda: _served(app) == 2)
        rejected = app.state.runtime.metrics.checkpoint_rejected.labels("invalid")
        assert rejected._value.get() >= 1


class _TamperingBus:
    """Publishes a damaged copy of each checkpoint (a faulty network or cache)."""

    def __init__(self, bus: RedisBus) -> None:
        self._bus = bus

    def publish(self, version: int, blob: bytes) -> None:
        damaged = bytearray(blob)
        damaged[-10] ^= 0x01
        self._bus.publish(version, bytes(damaged))


@pytest.mark.anyio
async def test_pin_rolls_every_replica_back_and_unpin_restores(settings, trainer):
    run = trainer[0]
    async with app_client(settings) as (client, app_a), app_client(settings) as (_, app_b):
        for batch in ("g", "h", "i"):
            await _decide_and_reward(client, 6, batch)
            run.run_once()
        await eventually(lambda: (_served(app_a), _served(app_b)) == (3, 3))

        pinned = await client.put("/v1/admin/pin", json={"version": 1})
        assert pinned.json() == {"pinned": 1, "serving": 1}
        await eventually(lambda: _served(app_b) == 1)
        await _decide_and_reward(client, 6, "j")
        run.run_once()  # a new version while pinned is stored but not served
        assert (_served(app_a), _served(app_b)) == (1, 1)
        assert (await client.put("/v1/admin/pin", json={"version": 99})).status_code == 404

        unpinned = await client.delete("/v1/admin/pin")
        assert unpinned.json() == {"pinned": None, "serving": 4}
        await eventually(lambda: _served(app_b) == 4)


def test_trainer_consumes_unrewarded_rows_by_the_window_rule(settings, trainer):
    run, sessions, _ = trainer

    for i in range(6):
        repository.save_decision(sessions, decision_row(f"w-{i}", [0.0, 1.0, float(i)]))
    for i in range(3):
        reward_rows.attach_reward(sessions, f"w-{i}", 1.0)
    report = run.run_once()
    assert (report.rewarded, report.defaulted, report.excluded) == (3, 0, 3)
    with psycopg.connect(settings.database_url) as connection:
        marks = connection.execute("select count(*) from decisions where trained_in = 1").fetchone()
    assert marks == (6,)
