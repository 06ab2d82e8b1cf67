"""Per-request arm features through /v1/select on an arm-feature network: they replace the
catalogue's for that decision, are stored with it, and are what the trainer trains on.

The app runs in-process on SQLite (`tests.support.app_client`); training is driven by
hand with a `Trainer` on the app's own sessions, store and bus.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from rofu.models import load_checkpoint
from rofu.service.db import repository
from rofu.service.deciding.features import featurize, normalise
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.log.export import export
from rofu.service.log.pages import Window
from rofu.service.runtime import Runtime
from rofu.service.settings import ArmSpec, Settings
from tests.support import app_client

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
CATALOGUE = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
CONTEXT = [0.5, -0.25, 1.0, 0.0]
OWN = [0.9, -1.5, 2.0]


@pytest.fixture
def settings(sqlite_settings: Settings) -> Settings:
    """An arm-feature network (f(x, z_a), three features per arm) over four arms."""
    return sqlite_settings.model_copy(
        update={
            "arm_feature_dim": 3,
            "arms": [ArmSpec(id=arm, features=z) for arm, z in zip(ARMS, CATALOGUE, strict=True)],
        }
    )


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


async def _select(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("context", CONTEXT)
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


async def _reward(client: httpx.AsyncClient, event_id: str, value: float) -> None:
    response = await client.post("/v1/reward", json={"event_id": event_id, "value": value})
    assert response.status_code == 200, response.text


async def _train(app: FastAPI) -> int:
    runtime = _runtime(app)
    trainer = Trainer(runtime.settings, runtime.sessions, runtime.store, runtime.local_bus)
    report = await anyio.to_thread.run_sync(trainer.run_once)
    assert report is not None
    assert report.loss is not None
    await anyio.to_thread.run_sync(runtime.follower.sync)
    return report.version


async def _with_checkpoint(client: httpx.AsyncClient, app: FastAPI) -> int:
    rng = random.Random(5)
    for _ in range(24):
        decision = await _select(client, context=[rng.uniform(-1, 1) for _ in range(4)])
        await _reward(client, decision["event_id"], 1.0 if decision["arm"] == "arm-1" else 0.0)
    return await _train(app)


def _scores(decision: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {s["arm"]: (s["mean"], s["bonus"]) for s in decision["scores"]}


@pytest.mark.anyio
async def test_per_request_arm_features_replace_the_catalogues_in_scoring(settings: Settings):
    async with app_client(settings) as (client, app):
        version = await _with_checkpoint(client, app)
        plain = await _select(client)
        own = await _select(client, arm_features={"arm-1": OWN})
        same = await _select(client, arm_features={"arm-1": CATALOGUE[1]})
        stored = repository.find_decisions(_runtime(app).sessions, [own["event_id"]])
    assert plain["model_version"] == own["model_version"] == version
    before, after = _scores(plain), _scores(own)
    assert after["arm-1"] != before["arm-1"]  # scored with the request's features
    assert {arm: after[arm] for arm in ARMS if arm != "arm-1"} == {
        arm: before[arm] for arm in ARMS if arm != "arm-1"
    }
    # The catalogue's own features sent per request: the catalogue's scores, to float32.
    for arm in ARMS:
        assert _scores(same)[arm] == pytest.approx(before[arm], rel=1e-5, abs=1e-6)
    assert stored[own["event_id"]].arm_features == {"arm-1": OWN}


@pytest.mark.anyio
async def test_named_arm_features_are_hashed_into_arm_feature_dim(settings: Settings):
    named = {"item": {"price": 9.5, "category": "shoes"}}
    async with app_client(settings) as (client, app):
        settings_seed = settings.feature_hash_seed
        decision = await _select(client, arm_features={"arm-2": named}, event_id="named-arm")
        again = await _select(
            client,
            arm_features={"arm-2": {"item": {"category": "shoes", "price": 9.5}}},
            event_id="named-arm",
        )
        clash = await client.post(
            "/v1/select",
            json={"context": CONTEXT, "event_id": "named-arm", "arm_features": {"arm-2": OWN}},
        )
        stored = repository.find_decisions(_runtime(app).sessions, ["named-arm"])["named-arm"]
    assert again == decision  # the same features in another key order: the same request
    assert clash.status_code == 409, clash.text  # other features: another request
    assert stored.arm_features == {"arm-2": featurize(named, 3, settings_seed)}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            {"exclude": ["arm-2"], "arm_features": {"arm-2": OWN}},
            "arm_features.arm-2",
            "not a candidate",
        ),
        (
            {"arms": ["arm-0", "arm-1"], "arm_features": {"arm-3": OWN}},
            "arm_features.arm-3",
            "not a candidate",
        ),
        ({"arm_features": {"arm-9": OWN}}, "arm_features.arm-9", "not a candidate"),
        ({"arm_features": {"arm-1": [1.0, 2.0]}}, "arm_features.arm-1", "expected 3 values"),
        ({"arm_features": {"arm-1": [1.0, 2.0, 3e6]}}, "arm_features.arm-1.2", "beyond the bound"),
        ({"arm_features": {"arm-1": {"p": {"q": {}}}}}, "arm_features.arm-1.p.q", "do not nest"),
        ({"arm_features": {"arm 1": OWN}}, "arm_features.arm 1.[key]", "pattern"),
    ],
)
async def test_per_request_arm_features_refused_naming_the_arm(
    settings: Settings, body: dict[str, Any], field: str, words: str
):
    async with app_client(settings) as (client, app):
        response = await client.post("/v1/select", json={"context": CONTEXT, **body})
        decisions = repository.find_decisions(_runtime(app).sessions, ["-"])
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert words in error["message"]
    assert decisions == {}


@pytest.mark.anyio
async def test_the_trainer_trains_on_the_arm_features_a_decision_used(settings: Settings):
    unique = [0.875, -0.625, 0.375, 0.125]
    async with app_client(settings) as (client, app):
        await _with_checkpoint(client, app)
        chosen = await _select(client, context=unique, arms=["arm-1"], arm_features={"arm-1": OWN})
        other = await _select(client, context=[-0.875, 0.625, 0.25, 0.5], arms=["arm-2"])
        await _reward(client, chosen["event_id"], 1.0)
        await _reward(client, other["event_id"], 0.0)
        await _train(app)
        stored = _runtime(app).store.latest()
    assert stored is not None
    sample = load_checkpoint(stored[1]).data.sample
    assert sample.features is not None
    assert len(sample) == 26
    rows = {tuple(round(v, 6) for v in x.tolist()): i for i, x in enumerate(sample.x)}
    mine = rows[tuple(unique)]
    assert int(sample.arms[mine]) == 1
    assert sample.features[mine].tolist() == pytest.approx(OWN)  # float32
    theirs = rows[(-0.875, 0.625, 0.25, 0.5)]
    assert (int(sample.arms[theirs]), sample.features[theirs].tolist()) == (2, CATALOGUE[2])
    for row in range(len(sample)):  # the others were scored with the catalogue's
        if row != mine:
            assert sample.features[row].tolist() == CATALOGUE[int(sample.arms[row])]


@pytest.mark.anyio
async def test_the_log_and_its_exports_show_the_named_context_and_arm_features_used(
    settings: Settings, tmp_path: Path
):
    named = {"user": {"age": 31, "country": "fr"}, "hour": 13}
    async with app_client(settings) as (client, _):
        await _select(client, context=named, arm_features={"arm-1": OWN}, event_id="logged-1")
        await _reward(client, "logged-1", 1.0)
        page = await client.get("/v1/decisions")
    assert page.status_code == 200, page.text
    (row,) = page.json()
    assert row["context"] == featurize(named, 4, 0)  # what the model read
    assert (row["named_context"], row["arm_features"]) == (normalise(named), {"arm-1": OWN})
    assert export(settings, "dsjson", Window(), tmp_path / "log.dsjson") == 1
    line = (tmp_path / "log.dsjson").read_text()
    event = json.loads(line)
    scored = {action["arm"]["id"]: action["z"] for action in event["c"]["_multi"]}
    assert scored["arm-1"] == {str(i): v for i, v in enumerate(OWN)}  # the request's own
    assert scored["arm-0"] == {str(i): v for i, v in enumerate(CATALOGUE[0])}
    assert event["rofu"]["named_context"] == normalise(named)
    vw = pytest.importorskip("vowpalwabbit")
    workspace = vw.Workspace("--cb_explore_adf --dsjson --quiet --strict_parse")
    assert len(workspace.parse(line)) == 1 + len(ARMS)  # VW reads it, extension and all
    workspace.finish()
    parquet = pytest.importorskip("pyarrow.parquet")
    assert export(settings, "parquet", Window(), tmp_path / "log.parquet") == 1
    (stored,) = parquet.read_table(tmp_path / "log.parquet").to_pylist()
    assert json.loads(stored["named_context"]) == normalise(named)
    assert stored["arm_features"] == [("arm-1", OWN)]


@pytest.mark.anyio
@pytest.mark.parametrize("cap", [None, 1e-3], ids=["fixed step", "stability cap"])
async def test_evaluation_rescores_the_log_with_each_requests_own_arm_features(
    settings: Settings, cap: float | None
):
    """`rofu evaluate` rescores what was served, with a stability cap too: the step it
    resolves for the checkpoint is the service's."""
    from rofu.service.log.service_log import checkpoint_scores, read_service_log

    settings = settings.model_copy(update={"stability_cap": cap})
    async with app_client(settings) as (client, app):
        version = await _with_checkpoint(client, app)
        logged = [
            await _select(client, context=[0.1 * i, 0.5, -0.5, 0.2], arm_features=own)
            for i, own in enumerate(({"arm-1": OWN}, {"arm-0": OWN, "arm-3": [0.0, 0.0, 1.0]}))
        ]
        for decision in logged:
            await _reward(client, decision["event_id"], 1.0)
        log = read_service_log(_runtime(app).sessions)
        scores = checkpoint_scores(settings, _runtime(app).sessions, log, version)
        served_on = _runtime(app).device.type
    # `rofu evaluate` rescores on the CPU: bit for bit what a CPU served, to float32
    # rounding what a GPU served (device `auto` serves on CUDA where present).
    rel = 1e-6 if served_on == "cpu" else 1e-4
    assert log.arm_features[-2:] == ({"arm-1": OWN}, {"arm-0": OWN, "arm-3": [0.0, 0.0, 1.0]})
    for row, decision in zip((len(log) - 2, len(log) - 1), logged, strict=True):
        for slot, served in enumerate(decision["scores"]):
            assert scores.mean[row, slot] == pytest.approx(served["mean"], rel=rel, abs=1e-9)
            assert scores.bonus[row, slot] == pytest.approx(served["bonus"], rel=rel, abs=1e-9)


@pytest.mark.anyio
async def test_every_accepted_arm_feature_is_scored_clamped_into_the_networks_range(
    settings: Settings,
):
    """Per-request arm features far outside what the network knows are scored clamped into
    the range of the catalogue's and the trained rows' features, widened by that range's
    width (as contexts are); they used to overflow into "scores not finite". The log keeps
    what was asked."""
    settings = settings.model_copy(update={"max_abs_feature": 1e30})
    async with app_client(settings) as (client, app):
        await _with_checkpoint(client, app)
        plain = await _select(client)
        for value in (1e6, 1e30):
            far = [value, -value, 0.5]
            response = await client.post(
                "/v1/select", json={"context": CONTEXT, "arm_features": {"arm-1": far}}
            )
            assert response.status_code == 200, response.text
            got = _scores(response.json())
            assert all(math.isfinite(m) and math.isfinite(b) for m, b in got.values())
            # arm-1 is scored at the range's edge; the other arms as without it.
            assert {arm: got[arm] for arm in ARMS if arm != "arm-1"} == {
                arm: _scores(plain)[arm] for arm in ARMS if arm != "arm-1"
            }
            stored = repository.find_decisions(
                _runtime(app).sessions, [response.json()["event_id"]]
            )
            assert stored[response.json()["event_id"]].arm_features == {"arm-1": far}
        edge = await _select(client, arm_features={"arm-1": [2.0, -1.0, 0.5]})  # 1 + width 1
    assert _scores(edge)["arm-1"] == pytest.approx(got["arm-1"], rel=1e-5, abs=1e-6)
