"""Apprentice mode: the request's `baseline_arm` checked, served (apprentice) or recorded
(online), logged beside rofu's own choice, part of the idempotency digest, and trained on."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import text

from rofu.models.checkpoint import load_checkpoint
from rofu.service.api.schemas import SelectRequest
from rofu.service.db import repository
from rofu.service.deciding.select import request_hash
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint

CONTEXT = [0.5, -0.25, 1.0, 0.0]
ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
Service = tuple[httpx.AsyncClient, FastAPI]


@pytest.fixture
def apprentice_settings(sqlite_settings: Settings) -> Settings:
    return sqlite_settings.model_copy(update={"learning_mode": "apprentice"})


@pytest.fixture
async def apprentice(apprentice_settings: Settings) -> AsyncIterator[Service]:
    async with app_client(apprentice_settings) as pair:
        yield pair


@pytest.fixture
async def online(sqlite_settings: Settings) -> AsyncIterator[Service]:
    async with app_client(sqlite_settings) as pair:
        yield pair


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


def _decisions(app: FastAPI) -> int:
    with _runtime(app).engine.connect() as connection:
        return int(connection.execute(text("select count(*) from decisions")).scalar_one())


async def _select(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("context", CONTEXT)
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


def test_apprentice_schema_takes_a_baseline_arm_id_and_nothing_else() -> None:
    assert SelectRequest(context=CONTEXT, baseline_arm="arm-2").baseline_arm == "arm-2"
    assert SelectRequest(context=CONTEXT).baseline_arm is None
    for bad in ("", "no spaces", 7, ["arm-1"], "x" * 129):
        with pytest.raises(ValidationError) as error:
            SelectRequest.model_validate({"context": CONTEXT, "baseline_arm": bad})
        assert error.value.errors()[0]["loc"] == ("baseline_arm",)
    learning = Settings(learning_mode="apprentice").learning_mode
    assert learning == "apprentice"
    assert Settings().learning_mode == "online"
    with pytest.raises(ValidationError, match="learning_mode"):
        Settings(learning_mode="shadow")


def test_apprentice_request_hash_includes_the_baseline_and_keeps_old_digests() -> None:
    plain = SelectRequest(context=CONTEXT, arms=["arm-1", "arm-2"])
    before = {"context": CONTEXT, "arms": ["arm-1", "arm-2"], "exclude": [], "explore": True}
    old = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert request_hash(plain) == old  # a request without a baseline: the digest it had
    one = request_hash(SelectRequest(context=CONTEXT, baseline_arm="arm-1"))
    two = request_hash(SelectRequest(context=CONTEXT, baseline_arm="arm-2"))
    assert len({one, two, request_hash(SelectRequest(context=CONTEXT))}) == 3


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"baseline_arm": "arm-9"}, "not an active arm"),
        ({"baseline_arm": "arm-3", "arms": ["arm-0", "arm-1"]}, "not among `arms`"),
        ({"baseline_arm": "arm-1", "exclude": ["arm-1"]}, "is excluded"),
        ({}, "required in apprentice mode"),
    ],
)
async def test_apprentice_refuses_a_baseline_that_is_not_a_candidate(
    apprentice: Service, body: dict[str, Any], words: str
) -> None:
    client, app = apprentice
    response = await client.post("/v1/select", json={"context": CONTEXT, **body})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "baseline_arm"
    assert "baseline_arm" in error["message"]
    assert words in error["message"]
    assert _decisions(app) == 0


@pytest.mark.anyio
async def test_online_refuses_an_excluded_baseline_and_takes_none(online: Service) -> None:
    client, _ = online
    body = {"context": CONTEXT, "baseline_arm": "arm-1", "exclude": ["arm-1"]}
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "baseline_arm"
    decision = await _select(client)  # online mode needs no baseline
    assert decision["baseline_arm"] is None
    assert decision["rofu_arm"] is None


@pytest.mark.anyio
async def test_apprentice_serves_the_baseline_and_logs_rofus_choice_beside_it(
    apprentice_settings: Settings,
) -> None:
    seed_checkpoint(apprentice_settings)  # rofu scores with a model, not a cold start
    async with app_client(apprentice_settings) as (client, app):
        decisions = [
            await _select(client, context=[i / 10, -0.5, 0.3, 1.0], baseline_arm="arm-2")
            for i in range(12)
        ]
        sessions = _runtime(app).sessions
        rows = repository.find_decisions(sessions, {d["event_id"] for d in decisions})
    for decision in decisions:
        assert decision["arm"] == "arm-2"
        assert decision["baseline_arm"] == "arm-2"
        assert decision["policy"] == "apprentice"
        assert decision["model_version"] == 1
        assert decision["propensity"] == 1.0
        served = {p["arm"]: p["probability"] for p in decision["probabilities"]}
        assert served == {"arm-0": 0.0, "arm-1": 0.0, "arm-2": 1.0, "arm-3": 0.0}
        assert all(s["mean"] is not None and s["ucb"] is not None for s in decision["scores"])
        row = rows[decision["event_id"]]
        assert (row.arm_id, row.slot, row.baseline_arm) == ("arm-2", 2, "arm-2")
        assert row.rofu_arm == decision["rofu_arm"]
        assert row.rofu_probabilities is not None
        assert math.isclose(sum(row.rofu_probabilities), 1.0)
        # rofu's own rule (argmax of the UCB with the preset's floor eps): the argmax has
        # 1 - eps + eps / K, every other arm eps / K, and rofu's arm was drawn from them
        ucb = {s["arm"]: s["ucb"] for s in decision["scores"]}
        floor, best = apprentice_settings.exploration_floor, ARMS.index(max(ucb, key=ucb.get))
        for slot, probability in enumerate(row.rofu_probabilities):
            want = 1 - floor + floor / len(ARMS) if slot == best else floor / len(ARMS)
            assert probability == pytest.approx(want, abs=1e-12)
        assert row.rofu_probabilities[ARMS.index(row.rofu_arm)] > 0


@pytest.mark.anyio
async def test_online_records_the_baseline_and_serves_rofus_choice(online: Service) -> None:
    client, app = online
    decisions = [await _select(client, baseline_arm="arm-0") for _ in range(40)]
    served = Counter(d["arm"] for d in decisions)
    assert set(served) == set(ARMS)  # the cold start's uniform choice, not the baseline
    for decision in decisions:
        assert decision["policy"] == "cold-start"
        assert decision["propensity"] == 0.25
        assert decision["baseline_arm"] == "arm-0"
        assert decision["rofu_arm"] is None
    rows = repository.find_decisions(_runtime(app).sessions, {d["event_id"] for d in decisions})
    assert {row.baseline_arm for row in rows.values()} == {"arm-0"}
    assert {row.rofu_arm for row in rows.values()} == {None}
    assert {row.rofu_probabilities is None for row in rows.values()} == {True}


@pytest.mark.anyio
async def test_apprentice_same_key_other_baseline_is_a_conflict(apprentice: Service) -> None:
    client, _ = apprentice
    first = await _select(client, event_id="order-1", baseline_arm="arm-1")
    again = await _select(client, event_id="order-1", baseline_arm="arm-1")
    assert again == first
    other = {"context": CONTEXT, "event_id": "order-1", "baseline_arm": "arm-3"}
    response = await client.post("/v1/select", json=other)
    assert response.status_code == 409
    assert response.json()["error"]["field"] == "event_id"


@pytest.mark.anyio
async def test_apprentice_rows_train_on_the_baselines_rewards(apprentice: Service) -> None:
    client, app = apprentice
    for i in range(30):
        baseline = ARMS[i % 2 + 2]  # arm-2 and arm-3 only
        decision = await _select(client, context=[i / 30, 0.1, -0.2, 0.4], baseline_arm=baseline)
        value = 1.0 if baseline == "arm-3" else 0.0
        reward = {"event_id": decision["event_id"], "value": value}
        assert (await client.post("/v1/reward", json=reward)).status_code == 200
    runtime = _runtime(app)
    trainer = Trainer(
        runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
    )
    report = await anyio.to_thread.run_sync(trainer.run_once)
    assert report is not None
    assert (report.version, report.rewarded, report.excluded) == (1, 30, 0)
    stored = runtime.store.get(1)
    assert stored is not None
    checkpoint = load_checkpoint(stored[1])
    data = checkpoint.data
    # the regulariser sample holds the served (baseline) arms, with their rewards
    assert data.arm_counts[:4].tolist() == [0, 0, 15, 15]
    assert sorted(zip(data.sample.arms.tolist(), data.sample.rewards.tolist(), strict=True)) == (
        [(2, 0.0)] * 15 + [(3, 1.0)] * 15
    )
    assert report.loss is not None
