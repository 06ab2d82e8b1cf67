"""Deferred decisions in the decision log: `GET /v1/decisions`, DSJSON and Parquet keep
them, marked; OBP rounds and `rofu evaluate`'s log leave out those not activated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rofu.service.db.engine import make_engine, session_factory
from rofu.service.log.export import export
from rofu.service.log.pages import Window
from rofu.service.log.service_log import read_service_log
from rofu.service.settings import Settings
from tests.support import app_client

CONTEXT = [0.25, -0.5, 1.0, 0.75]  # no zero: VW drops zero features
EVENTS = ("plain", "shown", "hidden")  # not deferred; deferred, activated; deferred only


@pytest.fixture
async def logged(sqlite_settings: Settings) -> Settings:
    """Three rewarded decisions: one plain, one deferred and activated, one deferred and
    never activated (a 60 s window: nothing has expired)."""
    settings = sqlite_settings.model_copy(update={"reward_window_seconds": 60.0})
    async with app_client(settings) as (client, _):
        for event_id in EVENTS:
            body = {"context": CONTEXT, "event_id": event_id, "defer": event_id != "plain"}
            assert (await client.post("/v1/select", json=body)).status_code == 200
            reward = {"event_id": event_id, "value": 1.0}
            assert (await client.post("/v1/reward", json=reward)).status_code == 200
        assert (await client.post("/v1/events/shown/activate")).status_code == 200
        records = (await client.get("/v1/decisions")).json()
    assert [(r["event_id"], r["deferred"], r["active"]) for r in records] == [
        ("plain", False, True),
        ("shown", True, True),
        ("hidden", True, False),
    ]
    assert [r["activated_at"] is not None for r in records] == [False, True, False]
    assert [r["reward"] for r in records] == [1.0, 1.0, 1.0]  # rewards stored regardless
    return settings


@pytest.mark.anyio
async def test_dsjson_marks_an_unactivated_decision_skip_learn_and_vw_skips_it(
    logged: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "log.dsjson"
    assert export(logged, "dsjson", Window(), path) == 3
    events = {e["EventId"]: e for e in map(json.loads, path.read_text().splitlines())}
    assert [events[e].get("_skipLearn") for e in EVENTS] == [None, None, True]
    assert events["hidden"]["rofu"]["deferred"] is True
    assert events["shown"]["rofu"]["activated_at"] is not None
    vw = pytest.importorskip("vowpalwabbit")
    workspace = vw.Workspace("--cb_explore_adf --dsjson --quiet --strict_parse")
    try:
        for event_id in EVENTS:
            examples = workspace.parse(json.dumps(events[event_id]))
            skipped = len(examples) == 1  # VW's reader drops a _skipLearn event
            assert skipped is (event_id == "hidden")
            workspace.finish_example(examples)
    finally:
        workspace.finish()


@pytest.mark.anyio
async def test_dsjson_action_taken_says_whether_a_deferred_decision_was_activated(
    logged: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "log.dsjson"
    assert export(logged, "dsjson", Window(), path) == 3
    events = {e["EventId"]: e for e in map(json.loads, path.read_text().splitlines())}
    outcomes = {event_id: events[event_id]["o"] for event_id in EVENTS}
    assert outcomes == {
        "plain": [{"v": 1.0, "EventId": "plain", "ActionTaken": False}],  # needs none
        "shown": [{"v": 1.0, "EventId": "shown", "ActionTaken": True}],
        "hidden": [{"v": 1.0, "EventId": "hidden", "ActionTaken": False}],
    }


@pytest.mark.anyio
async def test_obp_rounds_leave_out_the_unactivated_decision(
    logged: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "log.npz"
    assert export(logged, "obp", Window(), path) == 2
    assert export(logged, "obp", Window(), path, default_reward=0.0) == 2
    with np.load(path) as archive:
        assert int(archive["n_rounds"]) == 2


@pytest.mark.anyio
async def test_parquet_keeps_every_decision_with_its_activation(
    logged: Settings, tmp_path: Path
) -> None:
    parquet = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "log.parquet"
    assert export(logged, "parquet", Window(), path) == 3
    rows = parquet.read_table(path).to_pylist()
    assert [(r["event_id"], r["deferred"], r["active"]) for r in rows] == [
        ("plain", False, True),
        ("shown", True, True),
        ("hidden", True, False),
    ]
    assert [r["activated_at"] is not None for r in rows] == [False, True, False]


@pytest.mark.anyio
async def test_evaluation_leaves_out_the_unactivated_decision(logged: Settings) -> None:
    engine = make_engine(logged.database_url)
    try:
        log = read_service_log(session_factory(engine), default_reward=0.0)
    finally:
        engine.dispose()
    assert (len(log), log.unrewarded, log.unactivated) == (2, 0, 1)
