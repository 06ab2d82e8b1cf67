"""Business metrics: rewards by arm and policy, counted once per stored reward (late ones
included), the policy label read from the decision row, and the uniform policy's IPS
counters over the randomised rows."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from rofu.models.scores import ArmScore
from rofu.service.db import repository
from rofu.service.db.tables import DecisionRow, utcnow
from rofu.service.rewards.metrics import decision_policy, uniform_weight
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.support import app_client, seed_checkpoint

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


async def _samples(client: httpx.AsyncClient) -> Samples:
    body = (await client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, pairs), value in samples.items()
        if sample == name and labels.items() <= dict(pairs).items()
    )


def _scored(row: DecisionRow, means: list[float]) -> list[ArmScore]:
    return [ArmScore(arm, m, 0.1, m + 0.1) for arm, m in zip(row.candidates, means, strict=True)]


def test_reward_metrics_policy_label_comes_from_the_decision_row() -> None:
    row = decision_row("e", [0.0], arm="arm-1", slot=1, candidates=ARMS, model_version=2)
    assert decision_policy(row, _scored(row, [0.1, 0.5, 0.2, 0.0])) == "exploit"
    assert decision_policy(row, _scored(row, [0.1, 0.5, 0.5, 0.0])) == "exploit"  # a tie
    assert decision_policy(row, _scored(row, [0.1, 0.4, 0.5, 0.0])) == "explore"
    row.explore = False  # asked not to explore: the argmax of the mean
    assert decision_policy(row, _scored(row, [0.1, 0.4, 0.5, 0.0])) == "exploit"
    cold = decision_row("c", [0.0], arm="arm-1", slot=1, candidates=ARMS, model_version=0)
    assert decision_policy(cold, [ArmScore.unscored(arm) for arm in ARMS]) == "cold-start"
    row.policy = "apprentice"
    assert decision_policy(row, _scored(row, [0.1, 0.4, 0.5, 0.0])) == "apprentice"


def test_reward_metrics_uniform_weight_needs_every_candidate_possible() -> None:
    row = decision_row(
        "e", [0.0], arm="arm-1", slot=1, candidates=ARMS, propensity=0.7, model_version=2
    )
    row.probabilities = [0.1, 0.7, 0.1, 0.1]
    assert math.isclose(uniform_weight(row) or 0.0, 0.25 / 0.7)
    row.probabilities = [0.0, 0.7, 0.3, 0.0]  # arms 0 and 3 could not be chosen
    assert uniform_weight(row) is None
    row.probabilities = None  # a rofu row logged before probabilities were stored
    assert uniform_weight(row) is None
    cold = decision_row("c", [0.0], candidates=ARMS, propensity=0.25)
    assert uniform_weight(cold) == 1.0  # a cold start is uniform, logged or not


@pytest.fixture
async def windowed(sqlite_settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    settings = sqlite_settings.model_copy(update={"reward_window_seconds": 60.0})
    async with app_client(settings) as pair:
        yield pair


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.anyio
async def test_reward_metrics_count_each_stored_reward_once_late_ones_included(
    windowed: tuple[httpx.AsyncClient, FastAPI],
) -> None:
    client, app = windowed
    values = {"a": 1.0, "b": -0.5, "c": 0.0, "late": 2.0}
    arms = {}
    for event_id in [*values, "unrewarded"]:
        body = {"context": [0.5, -0.25, 1.0, 0.0], "event_id": event_id}
        arms[event_id] = (await _post(client, "/v1/select", body))["arm"]
    with _runtime(app).sessions() as session, session.begin():
        session.execute(
            update(DecisionRow)
            .where(DecisionRow.event_id == "late")
            .values(created_at=utcnow() - timedelta(seconds=61))
        )
    for event_id, value in values.items():
        await _post(client, "/v1/reward", {"event_id": event_id, "value": value})
    await _post(client, "/v1/reward", {"event_id": "a", "value": 1.0})  # a duplicate
    await client.post("/v1/reward", json={"event_id": "b", "value": 3.0})  # a conflict
    await client.post("/v1/reward", json={"event_id": "ghost", "value": 1.0})  # unknown
    samples = await _samples(client)

    outcomes = {o: _total(samples, "rofu_rewards_total", outcome=o) for o in ("accepted", "late")}
    assert outcomes == {"accepted": 3, "late": 1}
    assert _total(samples, "rofu_rewarded_decisions_total") == 4  # accepted + late
    assert _total(samples, "rofu_rewarded_decisions_total", policy="cold-start") == 4
    expected = Counter(arms[event_id] for event_id in values)
    for arm in ARMS:
        assert _total(samples, "rofu_rewarded_decisions_total", arm=arm) == expected[arm]
        positive = sum(v for e, v in values.items() if arms[e] == arm and v > 0)
        negative = sum(-v for e, v in values.items() if arms[e] == arm and v < 0)
        assert _total(samples, "rofu_reward_value_total", arm=arm, sign="positive") == positive
        assert _total(samples, "rofu_reward_value_total", arm=arm, sign="negative") == negative
    # a cold start is uniform: every row counts, with weight 1
    assert _total(samples, "rofu_uniform_ips_rows_total") == 4
    assert _total(samples, "rofu_uniform_ips_weight_total") == 4.0
    assert _total(samples, "rofu_uniform_ips_value_total", sign="positive") == 3.0
    assert _total(samples, "rofu_uniform_ips_value_total", sign="negative") == 0.5
    assert _total(samples, "rofu_uniform_ips_square_total") == 1.0 + 0.25 + 4.0
    assert _total(samples, "rofu_selections_total", policy="cold-start") == 5


@pytest.mark.anyio
async def test_reward_metrics_explore_exploit_and_ips_weights_follow_the_log(
    sqlite_settings: Settings,
) -> None:
    settings = sqlite_settings.model_copy(update={"exploration_floor": 0.5})
    seed_checkpoint(settings)
    rng = random.Random(5)
    decisions = []
    async with app_client(settings) as (client, app):
        for i in range(80):
            context = [rng.uniform(-1, 1) for _ in range(4)]
            body = {"context": context, "explore": i % 5 != 0}
            decision = await _post(client, "/v1/select", body)
            value = round(rng.uniform(-1, 2), 3)
            await _post(client, "/v1/reward", {"event_id": decision["event_id"], "value": value})
            decisions.append((decision, value))
        samples = await _samples(client)
        sessions = _runtime(app).sessions
        rows = repository.find_decisions(sessions, {d["event_id"] for d, _ in decisions})

    labels: Counter[str] = Counter()
    rows_, weight, value_sum, square = 0, 0.0, 0.0, 0.0
    for decision, value in decisions:
        means = {s["arm"]: s["mean"] for s in decision["scores"]}
        greedy = means[decision["arm"]] >= max(means.values())
        labels["exploit" if greedy or not decision["explore"] else "explore"] += 1
        probabilities = rows[decision["event_id"]].probabilities
        assert probabilities is not None
        if min(probabilities) > 0:
            w = 0.25 / decision["propensity"]
            rows_, weight, value_sum, square = (
                rows_ + 1,
                weight + w,
                value_sum + w * value,
                square + (w * value) ** 2,
            )
    assert set(labels) == {"explore", "exploit"}
    for policy, n in labels.items():
        assert _total(samples, "rofu_selections_total", policy=policy) == n
        assert _total(samples, "rofu_rewarded_decisions_total", policy=policy) == n
    assert rows_ == 64  # every exploring decision (the floor), none that asked not to
    assert _total(samples, "rofu_uniform_ips_rows_total") == rows_
    assert math.isclose(_total(samples, "rofu_uniform_ips_weight_total"), weight)
    numerator = _total(samples, "rofu_uniform_ips_value_total", sign="positive") - _total(
        samples, "rofu_uniform_ips_value_total", sign="negative"
    )
    assert math.isclose(numerator, value_sum, abs_tol=1e-9)
    assert math.isclose(_total(samples, "rofu_uniform_ips_square_total"), square)


@pytest.mark.anyio
async def test_reward_metrics_label_apprentice_decisions(sqlite_settings: Settings) -> None:
    settings = sqlite_settings.model_copy(update={"learning_mode": "apprentice"})
    async with app_client(settings) as (client, _):
        body = {"context": [0.5, -0.25, 1.0, 0.0], "baseline_arm": "arm-1"}
        decision = await _post(client, "/v1/select", body)
        await _post(client, "/v1/reward", {"event_id": decision["event_id"], "value": 1.5})
        samples = await _samples(client)
    labels = {"arm": "arm-1", "policy": "apprentice"}
    assert _total(samples, "rofu_selections_total", **labels) == 1
    assert _total(samples, "rofu_rewarded_decisions_total", **labels) == 1
    assert _total(samples, "rofu_reward_value_total", **labels, sign="positive") == 1.5
    assert _total(samples, "rofu_uniform_ips_rows_total") == 0  # the baseline: probability 1
