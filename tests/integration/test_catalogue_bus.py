"""An arm catalogue change reaches every replica through the Redis bus, not the poll."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.settings import Settings
from tests.support import app_client, eventually, require_redis


@pytest.fixture
def settings(pg_clean) -> Settings:
    return Settings(
        database_url=pg_clean,
        redis_url=require_redis(),
        redis_prefix=f"test-{uuid.uuid4().hex[:10]}",
        context_dim=3,
        hidden=(8,),
        embedded_trainer=False,
        checkpoint_poll_seconds=3600.0,  # a change can only arrive by the notice
        arm_refresh_seconds=3600.0,
    )


def _listeners(settings: Settings) -> int:
    bus = RedisBus(str(settings.redis_url), prefix=settings.redis_prefix)
    client = redis.Redis.from_url(str(settings.redis_url))
    try:
        return int(client.pubsub_numsub(bus.channel)[0][1])
    finally:
        client.close()
        bus.close()


def _active(app) -> set[str]:
    return {arm.id for arm in app.state.runtime.catalogue.current.arms if arm.active}


@pytest.mark.anyio
async def test_a_retired_or_added_arm_reaches_the_other_replica_by_notice(settings):
    async with app_client(settings) as (first, _), app_client(settings) as (second, app_b):
        assert _active(app_b) == {"arm-0", "arm-1", "arm-2", "arm-3"}
        await eventually(lambda: _listeners(settings) >= 2)  # both replicas subscribed
        started = time.monotonic()
        assert (await first.delete("/v1/arms/arm-2")).status_code == 200
        await eventually(lambda: "arm-2" not in _active(app_b), timeout=5.0)
        assert time.monotonic() - started < 5.0  # the README's bound with a working bus
        refused = await second.post("/v1/select", json={"context": [0, 0, 1], "arms": ["arm-2"]})
        assert refused.status_code == 422
        assert "retired" in refused.json()["error"]["message"]
        added = await first.post("/v1/arms", json={"id": "arm-9"})
        assert added.status_code == 201, added.text
        await eventually(lambda: "arm-9" in _active(app_b), timeout=5.0)
        chosen = await second.post("/v1/select", json={"context": [0, 0, 1], "arms": ["arm-9"]})
        assert (chosen.status_code, chosen.json()["arm"]) == (200, "arm-9")
