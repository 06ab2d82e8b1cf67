"""`explain: true` on /v1/select: per candidate, the context features that moved its mean
the most, by gradient x input through the served network, checked against finite
differences; named entries under their names; nothing for a replay or a cold start."""

from __future__ import annotations

import copy

import pytest
import torch
from fastapi import FastAPI

from rofu.service.deciding.explain import TOP_FEATURES
from rofu.service.deciding.features import named_entries
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint

CONTEXT = [0.9, -0.4, 0.3, 1.2]
NAMED = {"user": {"age": 3.0, "country": "fr"}, "hour": 2.0}


@pytest.fixture
def served(sqlite_settings: Settings) -> Settings:
    seed_checkpoint(sqlite_settings, n_rows=50)
    return sqlite_settings


def _finite_difference(app: FastAPI, context: list[float], slot: int, i: int) -> float:
    """(d mean / d x_i) x_i by a central difference on the served network (float64)."""
    runtime: Runtime = app.state.runtime
    snapshot = runtime.holder.current
    assert snapshot is not None
    net = copy.deepcopy(snapshot.net).double()  # the served network untouched
    x = snapshot.bounded(torch.tensor([context])).double()
    step = 1e-5
    up, down = x.clone(), x.clone()
    up[0, i] += step
    down[0, i] -= step
    with torch.no_grad():
        slope = (net.score_all(up)[0, slot] - net.score_all(down)[0, slot]) / (2 * step)
    return float(slope * x[0, i])


@pytest.mark.anyio
async def test_explain_gives_gradient_times_input_per_candidate(served):
    async with app_client(served) as (client, app):
        answer = await client.post("/v1/select", json={"context": CONTEXT, "explain": True})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        slots = {arm.id: arm.slot for arm in app.state.runtime.catalogue.current.arms}
        expected = {
            (arm, i): _finite_difference(app, CONTEXT, slots[arm], i)
            for arm in slots
            for i in range(len(CONTEXT))
        }
    assert body["policy"] == "rofu"
    explained = body["explanations"]
    assert [e["arm"] for e in explained] == [s["arm"] for s in body["scores"]]
    for entry in explained:
        assert len(entry["features"]) == min(TOP_FEATURES, len(CONTEXT))
        got = [abs(f["contribution"]) for f in entry["features"]]
        assert got == sorted(got, reverse=True)  # the largest first
        for feature in entry["features"]:
            assert feature["feature"] == f"context[{feature['index']}]"
            want = expected[(entry["arm"], feature["index"])]
            assert feature["contribution"] == pytest.approx(want, rel=1e-3, abs=1e-6)


@pytest.mark.anyio
async def test_explain_names_named_entries_and_is_not_part_of_the_request(served):
    async with app_client(served) as (client, _):
        first = await client.post(
            "/v1/select", json={"context": NAMED, "event_id": "why-1", "explain": True}
        )
        replay = await client.post(
            "/v1/select", json={"context": NAMED, "event_id": "why-1", "explain": True}
        )
        plain = await client.post("/v1/select", json={"context": NAMED})
    names = {
        (e.name if e.namespace == "" else f"{e.namespace}.{e.name}") for e in named_entries(NAMED)
    }
    assert names == {"user.age", "user.country=fr", "hour"}
    for entry in first.json()["explanations"]:
        assert {f["feature"] for f in entry["features"]} == names  # 3 entries, all shown
    assert replay.status_code == 200  # explain is not part of the request's identity
    assert replay.json()["arm"] == first.json()["arm"]
    assert replay.json()["explanations"] is None  # a replay is not re-scored
    assert plain.json()["explanations"] is None


@pytest.mark.anyio
async def test_explain_on_a_cold_start_gives_none(sqlite_settings):
    async with app_client(sqlite_settings) as (client, _):
        answer = await client.post("/v1/select", json={"context": CONTEXT, "explain": True})
    assert answer.json()["policy"] == "cold-start"
    assert answer.json()["explanations"] is None


@pytest.mark.anyio
async def test_explain_must_be_a_boolean(served):
    async with app_client(served) as (client, _):
        refused = await client.post("/v1/select", json={"context": CONTEXT, "explain": "yes"})
    assert refused.status_code == 422
    assert "explain" in refused.text


def test_the_client_sends_explain_only_when_asked():
    from rofu.client._calls import select_call

    asked = select_call(CONTEXT, None, None, None, True, explain=True)
    plain = select_call(CONTEXT, None, None, None, True)
    assert asked.body["explain"] is True
    assert "explain" not in plain.body
