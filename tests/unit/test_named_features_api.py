"""Named contexts through /v1/select, and the feature hash seed every checkpoint records.

The app runs in-process on SQLite (`tests.support.app_client`); training is driven by
hand with a `Trainer` on the app's own sessions, store and bus.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
import torch
from fastapi import FastAPI
from sqlalchemy import text

from rofu.models import Checkpoint, CheckpointError, dump_checkpoint, load_checkpoint
from rofu.service.db import repository
from rofu.service.deciding.features import featurize, normalise
from rofu.service.deciding.snapshot import HASH_SEED_KEY, load_served
from rofu.service.errors import Conflict
from rofu.service.lifecycle.follower import ModelState
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.factories import make_data, make_net
from tests.support import app_client

NAMED = {"user": {"age": 31, "country": "fr", "tags": ["a", "b"]}, "device": {"mobile": True}}
REORDERED = {"device": {"mobile": True}, "user": {"tags": ["a", "b"], "country": "fr", "age": 31.0}}


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


def _decisions(app: FastAPI) -> int:
    with _runtime(app).engine.connect() as connection:
        return int(connection.execute(text("select count(*) from decisions")).scalar_one())


async def _train(app: FastAPI, n: int, client: httpx.AsyncClient) -> int:
    """Log `n` rewarded decisions on named contexts, train, and return the new version."""
    for i in range(n):
        context = {"user": {"age": i % 7, "country": ["fr", "de", "es"][i % 3]}, "hour": i % 5}
        chosen = await client.post("/v1/select", json={"context": context})
        assert chosen.status_code == 200, chosen.text
        value = 1.0 if chosen.json()["arm"] == "arm-1" else 0.0
        rewarded = await client.post(
            "/v1/reward", json={"event_id": chosen.json()["event_id"], "value": value}
        )
        assert rewarded.status_code == 200, rewarded.text
    runtime = _runtime(app)
    trainer = Trainer(runtime.settings, runtime.sessions, runtime.store, runtime.local_bus)
    report = await anyio.to_thread.run_sync(trainer.run_once)
    assert report is not None
    assert report.loss is not None
    await anyio.to_thread.run_sync(runtime.follower.sync)
    return report.version


@pytest.mark.anyio
async def test_select_hashes_a_named_context_and_stores_both_forms(sqlite_settings: Settings):
    async with app_client(sqlite_settings) as (client, app):
        first = await client.post("/v1/select", json={"context": NAMED, "event_id": "named-1"})
        assert first.status_code == 200, first.text
        stored = repository.find_decisions(_runtime(app).sessions, ["named-1"])["named-1"]
        assert stored.context == featurize(NAMED, 4, 0)  # what the model read and trains on
        assert stored.named_context == normalise(NAMED)  # what the client sent, for audit
        # The same named context in another key order (31 as 31.0) is the same request.
        again = await client.post("/v1/select", json={"context": REORDERED, "event_id": "named-1"})
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
        other = {**NAMED, "device": {"mobile": False}}
        clash = await client.post("/v1/select", json={"context": other, "event_id": "named-1"})
        assert clash.status_code == 409, clash.text
        dense = await client.post("/v1/select", json={"context": [0.0] * 4, "event_id": "dense-1"})
        assert dense.status_code == 200, dense.text
        row = repository.find_decisions(_runtime(app).sessions, ["dense-1"])["dense-1"]
        assert (row.named_context, row.arm_features) == (None, None)
        assert _decisions(app) == 2


@pytest.mark.anyio
async def test_select_scores_a_named_context_as_its_hashed_vector(sqlite_settings: Settings):
    settings = sqlite_settings.model_copy(update={"context_dim": 16, "feature_hash_seed": 11})
    async with app_client(settings) as (client, app):
        version = await _train(app, 24, client)
        answers = [
            await client.post("/v1/select", json={"context": context})
            for context in (NAMED, REORDERED, featurize(NAMED, 16, 11))
        ]
    bodies = [answer.json() for answer in answers]
    assert all(answer.status_code == 200 for answer in answers)
    assert {body["model_version"] for body in bodies} == {version}
    assert bodies[0]["scores"] == bodies[1]["scores"] == bodies[2]["scores"]
    assert bodies[0]["probabilities"] == bodies[1]["probabilities"] == bodies[2]["probabilities"]
    assert len({body["event_id"] for body in bodies}) == 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("context", "field", "words"),
    [
        ({"user": {"address": {"city": "x"}}}, "context.user.address", "do not nest"),
        ({"user": {"tags": ["a", 1]}}, "context.user.tags.1", "only strings or only numbers"),
        ({"user": {"age": 2e6}}, "context.user.age", "ROFU_MAX_ABS_FEATURE"),
        ({"user": {"age": [1e6]}}, None, None),  # at the bound: accepted
        ({"user": {"age": [1e6]}, "x": 1}, "context", "user.age.0, x hash to index 3"),
        ("a=1", "context", "an array of numbers or an object of named features"),
        ([1.0, 2.0], "context", "expected 4 values, got 2"),
    ],
)
async def test_select_refuses_bad_named_features_naming_the_key(
    sqlite_settings: Settings, context: object, field: str | None, words: str | None
):
    async with app_client(sqlite_settings) as (client, app):
        response = await client.post("/v1/select", json={"context": context})
        if field is None:
            assert response.status_code == 200, response.text
            return
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == field
        assert error["message"].startswith(f"{field}: ")
        assert words in error["message"]
        assert _decisions(app) == 0


@pytest.mark.anyio
async def test_select_refuses_arm_features_for_a_model_with_one_output_per_arm(
    sqlite_settings: Settings,
):
    async with app_client(sqlite_settings) as (client, app):
        body = {"context": [0.0] * 4, "arm_features": {"arm-1": [1.0, 2.0]}}
        response = await client.post("/v1/select", json=body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["field"] == "arm_features"
        assert "ROFU_ARM_FEATURE_DIM is 0" in error["message"]
        assert _decisions(app) == 0


@pytest.mark.anyio
async def test_checkpoints_record_the_hash_seed_and_another_seed_refuses_them(
    sqlite_settings: Settings,
):
    seeded = sqlite_settings.model_copy(update={"feature_hash_seed": 7})
    async with app_client(seeded) as (client, app):
        version = await _train(app, 12, client)
        model = (await client.get("/v1/model")).json()
        assert (model["version"], model["feature_hash_seed"]) == (version, 7)
        stored = _runtime(app).store.latest()
    assert stored is not None
    checkpoint = load_checkpoint(stored[1])
    assert checkpoint.extra[HASH_SEED_KEY] == "7"
    assert json.loads(checkpoint.extra["config"])["feature_hash_seed"] == 7
    other = sqlite_settings.model_copy(update={"feature_hash_seed": 8})
    async with app_client(other) as (client, app):
        runtime = _runtime(app)
        ready = await client.get("/readyz")
        assert ready.status_code == 503, ready.text  # refused, as another network would be
        assert ready.json()["checks"]["model"] == ModelState.REFUSED
        assert (await client.get("/v1/model")).json()["version"] == 0
        with pytest.raises(Conflict, match="seed 7"):
            await anyio.to_thread.run_sync(runtime.follower.pin, version)
        chosen = await client.post("/v1/select", json={"context": NAMED})
        await client.post("/v1/reward", json={"event_id": chosen.json()["event_id"], "value": 1})
        trainer = Trainer(other, runtime.sessions, runtime.store, runtime.local_bus)
        with pytest.raises(CheckpointError, match="ROFU_FEATURE_HASH_SEED=8"):
            await anyio.to_thread.run_sync(trainer.run_once)  # nor continued by a trainer


def test_load_served_accepts_a_checkpoint_that_records_no_seed() -> None:
    net = make_net(4, 2).float()
    checkpoint = Checkpoint(
        1, net.config, net.state_dict(), make_data(6, 4, 2, dtype=torch.float32)
    )
    assert HASH_SEED_KEY not in checkpoint.extra  # made before named features existed
    assert load_served(dump_checkpoint(checkpoint), net.config, hash_seed=123).version == 1
