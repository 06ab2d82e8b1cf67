"""The service as a real uvicorn process driven by a real HTTP client."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import httpx
import pytest

from rofu.service.settings import ArmSpec, Settings
from tests.support import seed_checkpoint, service_process

ARMS = [f"item-{i}" for i in range(6)]


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


@pytest.fixture
def served(tmp_path):
    """A service process on SQLite with a trained checkpoint (real ROFU scoring)."""
    database = tmp_path / "rofu.sqlite"
    settings = Settings(
        database_url=f"sqlite:///{database}",
        context_dim=5,
        hidden=(32, 32),
        arms=[ArmSpec(id=a) for a in ARMS],
        max_arms=8,
    )
    seed_checkpoint(settings, n_rows=500)
    env = {
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_CONTEXT_DIM": "5",
        "ROFU_HIDDEN": "[32, 32]",
        "ROFU_ARMS": '[{"id": "' + '"}, {"id": "'.join(ARMS) + '"}]',
        "ROFU_MAX_ARMS": "8",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_BATCH_MAX_WAIT_MS": "5",
    }
    with service_process(env, tmp_path / "service.log") as base_url:
        yield base_url, database


@pytest.mark.anyio
async def test_service_answers_200_concurrent_selects(served):
    base_url, database = served
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        assert (await client.get("/v1/model")).json()["version"] == 1
        contexts = [[(i % 7) / 7, 1.0, -0.5, i / 200, 0.0] for i in range(200)]
        bodies = [{"context": c, "event_id": f"c-{i}"} for i, c in enumerate(contexts)]
        responses = await asyncio.gather(*[client.post("/v1/select", json=b) for b in bodies])
        metrics = (await client.get("/metrics")).text

    assert [r.status_code for r in responses] == [200] * 200
    for i, response in enumerate(responses):
        body = response.json()
        assert body["event_id"] == f"c-{i}"
        assert body["policy"] == "rofu"
        assert body["model_version"] == 1
        assert body["arm"] in ARMS
        scores = {s["arm"]: s for s in body["scores"]}
        assert set(scores) == set(ARMS)
        best = max(scores.values(), key=lambda s: s["ucb"])
        assert scores[body["arm"]]["ucb"] == best["ucb"]
        assert all(
            s["bonus"] >= 0 and s["ucb"] == pytest.approx(s["mean"] + s["bonus"])
            for s in scores.values()
        )
    with sqlite3.connect(database) as db:
        logged = dict(db.execute("select event_id, arm_id from decisions").fetchall())
    assert logged == {r.json()["event_id"]: r.json()["arm"] for r in responses}
    batches = _metric(metrics, "rofu_select_batch_size_count")
    assert batches < 200, "concurrent requests were scored in micro-batches"
    assert _metric(metrics, "rofu_select_batch_size_sum") == 200


@pytest.mark.anyio
async def test_service_reward_round_trip_is_durable(served):
    base_url, database = served
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        chosen = await client.post(
            "/v1/select", json={"context": [0, 1, 0, 1, 0], "event_id": "r-1"}
        )
        assert chosen.status_code == 200
        reward = await client.post("/v1/reward", json={"event_id": "r-1", "value": 3.5})
        assert reward.status_code == 200
        # Durable before the 2xx: another connection sees it at once.
        with sqlite3.connect(database) as db:
            assert db.execute("select value from rewards where event_id = 'r-1'").fetchall() == [
                (3.5,)
            ]
        assert (await client.get("/healthz")).json() == {"status": "ok", "checks": {}}
        ready = (await client.get("/readyz")).json()
        assert ready["checks"] == {"database": "ok", "model": "loaded"}
