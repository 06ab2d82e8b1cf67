"""The holdout: units assigned by hash, sticky and in the configured share; the control
served (baseline, else uniform) and logged with its true probabilities and rofu's choice
beside it; never trained on; guardrail metrics stored with rewards."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from rofu.models.checkpoint import load_checkpoint
from rofu.service.api.schemas import SelectRequest
from rofu.service.db import repository
from rofu.service.db.tables import RewardRow
from rofu.service.deciding.holdout import in_holdout, unit_uniform
from rofu.service.deciding.select import request_hash
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint

CONTEXT = [0.5, -0.25, 1.0, 0.0]
ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


async def _select(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("context", CONTEXT)
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


def test_units_hash_into_the_share_stably_and_the_salt_reshuffles_them() -> None:
    units = [f"user-{i}" for i in range(20_000)]
    held = [u for u in units if in_holdout(0.2, "exp-1", u)]
    assert abs(len(held) / len(units) - 0.2) < 0.01  # 4 standard deviations: 0.011
    assert held == [u for u in units if in_holdout(0.2, "exp-1", u)]  # same answer again
    assert unit_uniform("exp-1", "user-7") == unit_uniform("exp-1", "user-7")
    other = {u for u in units if in_holdout(0.2, "exp-2", u)}
    overlap = len(other & set(held)) / len(held)
    assert abs(overlap - 0.2) < 0.03  # another salt: independent of the first assignment
    assert not any(in_holdout(0.0, "exp-1", u) for u in units[:1000])
    # nested shares: a unit held out at 10% stays held out at 20%
    assert {u for u in units if in_holdout(0.1, "exp-1", u)} <= set(held)


def test_holdout_settings_are_bounded_and_refuse_apprentice_mode() -> None:
    assert Settings().holdout_share == 0.0
    assert Settings(holdout_share=0.2).holdout_share == 0.2
    for bad in (-0.1, 0.6, math.nan):
        with pytest.raises(ValidationError, match="holdout_share"):
            Settings(holdout_share=bad)
    with pytest.raises(ValidationError, match="holdout_share: apprentice mode"):
        Settings(holdout_share=0.2, learning_mode="apprentice")
    with pytest.raises(ValidationError, match="holdout_salt"):
        Settings(holdout_salt="")


def test_unit_id_is_validated_and_part_of_the_request_identity() -> None:
    plain = request_hash(SelectRequest(context=CONTEXT))
    one = request_hash(SelectRequest(context=CONTEXT, unit_id="user-1"))
    two = request_hash(SelectRequest(context=CONTEXT, unit_id="user-2"))
    assert len({plain, one, two}) == 3
    for bad in ("", "has space", 7, "x" * 129):
        with pytest.raises(ValidationError) as error:
            SelectRequest.model_validate({"context": CONTEXT, "unit_id": bad})
        assert error.value.errors()[0]["loc"] == ("unit_id",)


@pytest.fixture
def holdout_settings(sqlite_settings: Settings) -> Settings:
    settings = sqlite_settings.model_copy(update={"holdout_share": 0.3, "holdout_salt": "t"})
    seed_checkpoint(settings)  # rofu scores with a model, not a cold start
    return settings


@pytest.mark.anyio
async def test_holdout_units_get_the_control_logged_as_it_was_served(
    holdout_settings: Settings,
) -> None:
    async with app_client(holdout_settings) as (client, app):
        units = [f"user-{i}" for i in range(40)]
        first = {u: await _select(client, unit_id=u) for u in units}
        again = {u: await _select(client, unit_id=u, baseline_arm="arm-2") for u in units}
        plain = [await _select(client) for _ in range(200)]
        rows = repository.find_decisions(
            _runtime(app).sessions,
            {d["event_id"] for d in [*first.values(), *again.values(), *plain]},
        )
    for unit in units:
        expected = "holdout" if in_holdout(0.3, "t", unit) else "rofu"
        assert first[unit]["experiment"] == again[unit]["experiment"] == expected  # sticky
    held = [d for d in first.values() if d["experiment"] == "holdout"]
    assert held
    assert len(held) < len(units)
    for decision in held:  # no baseline: uniform over the candidates
        assert decision["policy"] == "holdout"
        assert decision["propensity"] == 0.25
        assert {p["probability"] for p in decision["probabilities"]} == {0.25}
        row = rows[decision["event_id"]]
        assert (row.experiment, row.unit_id, row.arm_id) == (
            "holdout",
            row.unit_id,
            decision["arm"],
        )
        assert row.rofu_arm == decision["rofu_arm"] is not None
        assert row.rofu_probabilities is not None
        assert math.isclose(sum(row.rofu_probabilities), 1.0)
    for decision in again.values():
        if decision["experiment"] == "holdout":  # the app's own choice, probability 1
            assert (decision["arm"], decision["propensity"]) == ("arm-2", 1.0)
            served = {p["arm"]: p["probability"] for p in decision["probabilities"]}
            assert served == {"arm-0": 0.0, "arm-1": 0.0, "arm-2": 1.0, "arm-3": 0.0}
        else:
            assert decision["policy"] != "holdout"
            assert decision["rofu_arm"] is None
    groups = Counter(d["experiment"] for d in plain)  # no unit: each request drawn afresh
    assert 30 <= groups["holdout"] <= 90  # 200 x 0.3 = 60, sd 6.5
    arms = Counter(d["arm"] for d in plain if d["experiment"] == "holdout")
    assert set(arms) == set(ARMS)  # the uniform control, not rofu's argmax
    assert {rows[d["event_id"]].unit_id for d in plain} == {None}


@pytest.mark.anyio
async def test_no_holdout_records_no_experiment(sqlite_settings: Settings) -> None:
    seed_checkpoint(sqlite_settings)
    async with app_client(sqlite_settings) as (client, app):
        decision = await _select(client, unit_id="user-1")
        row = repository.find_decision(_runtime(app).sessions, decision["event_id"])
    assert decision["experiment"] is None
    assert decision["policy"] != "holdout"
    assert row is not None
    assert (row.experiment, row.unit_id) == (None, None)


@pytest.mark.anyio
async def test_the_trainer_consumes_holdout_rows_and_never_trains_on_them(
    holdout_settings: Settings,
) -> None:
    async with app_client(holdout_settings) as (client, app):
        rewards: dict[str, float] = {}
        for i in range(60):
            decision = await _select(client, context=[i / 60, 0.2, -0.1, 0.3])
            value = 0.001 * i + 0.5  # a distinct reward per decision
            posted = {"event_id": decision["event_id"], "value": value}
            assert (await client.post("/v1/reward", json=posted)).status_code == 200
            rewards[decision["experiment"]] = rewards.get(decision["experiment"], 0) + 1
            rewards[decision["event_id"]] = value
        runtime = _runtime(app)
        trainer = Trainer(
            runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
        )
        report = await anyio.to_thread.run_sync(trainer.run_once)
        assert report is not None
        rows = repository.find_decisions(
            runtime.sessions, {k for k in rewards if k not in ("rofu", "holdout")}
        )
        stored = runtime.store.get(report.version)
    assert stored is not None
    held = {e: r for e, r in rows.items() if r.experiment == "holdout"}
    kept = {e: r for e, r in rows.items() if r.experiment == "rofu"}
    assert held
    assert kept
    assert report.consumed == 60
    assert (report.rewarded, report.excluded) == (len(kept), len(held))
    assert {r.trained_in for r in rows.values()} == {report.version}  # all consumed
    sample = load_checkpoint(stored[1]).data.sample.rewards.tolist()
    trained = {round(v, 6) for v in sample}
    assert {round(rewards[e], 6) for e in kept} <= trained
    assert not {round(rewards[e], 6) for e in held} & trained


@pytest.mark.anyio
async def test_guardrail_metrics_are_stored_with_the_reward_and_checked(
    sqlite_settings: Settings,
) -> None:
    async with app_client(sqlite_settings) as (client, app):
        decision = await _select(client)
        event = decision["event_id"]
        for bad, field in [
            ({"metrics": {"latency ms": 1.0}}, "metrics"),
            ({"metrics": {"latency_ms": "fast"}}, "metrics"),
            ({"metrics": {"latency_ms": 1e7}}, "metrics.latency_ms"),
            ({"metrics": {f"m{i}": 1.0 for i in range(17)}}, "metrics"),
        ]:
            response = await client.post("/v1/reward", json={"event_id": event, "value": 1, **bad})
            assert response.status_code == 422, (bad, response.text)
            assert response.json()["error"]["field"].startswith(field), response.text
        metrics = {"latency_ms": 120.0, "revenue": 9.5}
        body = {"event_id": event, "value": 1.0, "metrics": metrics}
        assert (await client.post("/v1/reward", json=body)).status_code == 200
        repeat = await client.post("/v1/reward", json=body)
        assert repeat.status_code == 200
        assert repeat.json()["duplicate"]
        other = await client.post("/v1/reward", json={**body, "metrics": {"latency_ms": 1.0}})
        assert other.status_code == 409
        assert other.json()["error"]["field"] == "metrics"
        runtime = _runtime(app)
        with runtime.sessions() as session:
            stored = session.query(RewardRow).one()
    assert (stored.value, stored.metrics) == (1.0, metrics)
