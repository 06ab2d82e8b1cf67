"""Replicas never trust the Redis bus, over real Redis and Postgres: a forged checkpoint
(well formed, its own checksum right) is served only if the database records its version
and bytes, and a blob over the size limit is never downloaded."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rofu.models import dump_checkpoint, load_checkpoint
from rofu.service.api.app import create_app
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.settings import Settings
from tests.support import eventually, require_redis


class RedisSpy:
    """A Redis client recording the key of every GET and STRLEN it is asked."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        if name not in ("get", "strlen"):
            return found

        def recorded(key: str, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, key))
            return found(key, *args, **kwargs)

        return recorded

    def count(self, command: str, key: str) -> int:
        return self.calls.count((command, key))


@pytest.fixture
def settings(pg_clean) -> Settings:
    return Settings(
        database_url=pg_clean,
        redis_url=require_redis(),
        redis_prefix=f"test-{uuid.uuid4().hex[:10]}",
        context_dim=3,
        hidden=(8,),
        reward_window_seconds=0.0,
        fit_steps=20,
        checkpoint_poll_seconds=3600.0,  # the tests sync the replicas themselves
    )


@pytest.fixture
def trainer(settings):
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    bus = RedisBus(settings.redis_url, prefix=settings.redis_prefix)
    yield Trainer(settings, sessions, CheckpointStore(sessions), bus), sessions, bus
    bus.close()
    engine.dispose()


@contextlib.asynccontextmanager
async def replica(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI, RedisSpy]]:
    """An app whose Redis reads are recorded from before it starts, and its client."""
    app = create_app(settings)
    bus = app.state.runtime.redis
    spy = bus._client = RedisSpy(bus._client)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rofu.test") as client:
            yield client, app, spy


async def _train(client: httpx.AsyncClient, run: Trainer, prefix: str) -> None:
    """Decide and reward a few contexts, then run the trainer once."""
    for i in range(8):
        event = {"context": [i / 8, 1.0, -i / 8], "event_id": f"{prefix}-{i}"}
        assert (await client.post("/v1/select", json=event)).status_code == 200
        await client.post("/v1/reward", json={"event_id": f"{prefix}-{i}", "value": i / 8})
    assert run.run_once() is not None


def _served(app: FastAPI) -> int:
    current = app.state.runtime.holder.current
    return 0 if current is None else current.version


async def _sync(app: FastAPI, times: int = 3) -> None:
    """What the poll loop does, a few times."""
    for _ in range(times):
        await asyncio.to_thread(app.state.runtime.follower.sync)


def _rejected(app: FastAPI) -> Callable[[str], float]:
    counter = app.state.runtime.metrics.checkpoint_rejected
    return lambda reason: counter.labels(reason)._value.get()


def _forged(blob: bytes, version: int) -> bytes:
    """A well-formed checkpoint of `version` with other parameters: its checksum, being
    unkeyed, is right."""
    real = load_checkpoint(blob)
    state = {name: tensor + 0.5 for name, tensor in real.state.items()}
    return dump_checkpoint(dataclasses.replace(real, version=version, state=state))


@pytest.mark.anyio
async def test_a_forged_checkpoint_the_database_lacks_is_never_served(settings, trainer):
    run, _, bus = trainer
    async with replica(settings) as (client, app, spy), replica(settings) as (_, other, _):
        await _train(client, run, "a")
        await eventually(lambda: (_served(app), _served(other)) == (1, 1))
        bus.publish(1000, _forged(bus.fetch(1), 1000))  # the key, the pointer, a notice
        await eventually(lambda: _rejected(app)("unrecorded") == 1)
        await _sync(app)
        assert (_served(app), _served(other)) == (1, 1)
        assert spy.count("get", bus.key(1000)) == 0  # not even downloaded
        reply = (await client.post("/v1/select", json={"context": [0, 1, 0]})).json()
        assert reply["model_version"] == 1

        await _train(client, run, "b")  # a later real version is served
        await eventually(lambda: (_served(app), _served(other)) == (2, 2))
        assert _rejected(app)("unrecorded") == 1  # reported once
        metrics = (await client.get("/metrics")).text
        assert 'rofu_checkpoint_rejected_total{reason="unrecorded"} 1.0' in metrics


@pytest.mark.anyio
async def test_a_forged_copy_of_a_real_version_is_refused_by_a_new_replica(settings, trainer):
    run, sessions, bus = trainer
    async with replica(settings) as (client, first, _):
        await _train(client, run, "c")
        await eventually(lambda: _served(first) == 1)
        real = repository.get_checkpoint(sessions, 1)
        bus._client.set(bus.key(1), _forged(real.blob, 1))  # overwrites the real key
        async with replica(settings) as (_, second, spy):
            current = second.state.runtime.holder.current
            assert (current.version, current.checksum) == (1, real.checksum)
            assert _rejected(second)("mismatch") == 1
            await _sync(second)
            assert spy.count("get", bus.key(1)) == 1  # refused once, never read again

            await _train(client, run, "d")
            await eventually(lambda: (_served(first), _served(second)) == (2, 2))
            current = second.state.runtime.holder.current
            assert current.checksum == repository.get_checkpoint(sessions, 2).checksum
            assert _rejected(second)("mismatch") == 1


class _PaddingBus:
    """Publishes each checkpoint with `extra` bytes appended (a huge blob on the bus)."""

    def __init__(self, bus: RedisBus, extra: int) -> None:
        self._bus, self._extra = bus, extra

    def publish(self, version: int, blob: bytes) -> None:
        self._bus.publish(version, blob + b"\0" * self._extra)


@pytest.mark.anyio
async def test_an_oversized_bus_copy_is_never_downloaded(settings, trainer):
    run, _, bus = trainer
    async with replica(settings) as (client, app, spy):
        await _train(client, run, "e")
        await eventually(lambda: _served(app) == 1)
        run._bus = _PaddingBus(bus, settings.checkpoint_byte_limit())
        await _train(client, run, "f")  # stored durably, published padded past the limit
        await eventually(lambda: _served(app) == 2)  # the database's copy
        await _sync(app)
        assert (spy.count("strlen", bus.key(2)), spy.count("get", bus.key(2))) == (1, 0)
        assert _rejected(app)("oversized") == 1


@pytest.mark.anyio
async def test_checkpoints_over_the_limit_are_refused_unread_and_not_retried(settings, trainer):
    run, sessions, bus = trainer
    async with replica(settings) as (client, _, _):
        await _train(client, run, "g")
    size = repository.get_checkpoint(sessions, 1).size_bytes
    small = settings.model_copy(update={"max_checkpoint_bytes": size - 1})
    async with replica(small) as (client, app, spy):
        assert _served(app) == 0
        assert (await client.get("/readyz")).status_code == 503  # valid ones are refused
        await _sync(app)
        assert (spy.count("strlen", bus.key(1)), spy.count("get", bus.key(1))) == (1, 0)
        assert _rejected(app)("oversized") == 2  # the Redis copy and the stored one, once
