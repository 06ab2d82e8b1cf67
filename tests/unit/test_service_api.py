"""The HTTP API in-process on SQLite: decisions, rewards, the catalogue, health and metrics.

The app runs through its lifespan (`tests.support.app_client`); training is driven by
hand with a `Trainer` on the app's own sessions, store and bus (sqlite_settings turns the
background trainer off and closes reward windows at once).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import pytest
import torch
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import chisquare
from sqlalchemy import text

from rofu.models import rofu_scores
from rofu.models.rofu import ntk_basis
from rofu.service.api.app import create_app
from rofu.service.db import repository
from rofu.service.db.faults import DatabaseStatus
from rofu.service.deciding.scoring import checkpoint_generator
from rofu.service.lifecycle.follower import ModelState
from rofu.service.lifecycle.trainer import Trainer, TrainReport
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import app_client, seed_checkpoint

CONTEXT = [0.5, -0.25, 1.0, 0.0]
ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
Service = tuple[httpx.AsyncClient, FastAPI]


@pytest.fixture
async def service(sqlite_settings: Settings) -> AsyncIterator[Service]:
    async with app_client(sqlite_settings) as pair:
        yield pair


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


def _count(app: FastAPI, table: str) -> int:
    with _runtime(app).engine.connect() as connection:
        return int(connection.execute(text(f"select count(*) from {table}")).scalar_one())


async def _select(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    body.setdefault("context", CONTEXT)
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


def _error(
    response: httpx.Response, status: int, field: str | None, *, named: bool = True
) -> dict[str, Any]:
    """The error body, after checking its status, field and that the message names it."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["field"] == field
    if field is not None and named:
        assert field in error["message"]
    return error


async def _train(app: FastAPI) -> TrainReport:
    runtime = _runtime(app)
    trainer = Trainer(
        runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
    )
    report = await anyio.to_thread.run_sync(trainer.run_once)
    assert report is not None
    return report


async def _with_checkpoint(client: httpx.AsyncClient, app: FastAPI) -> TrainReport:
    """Log 24 rewarded decisions (arm-1 pays) and train one checkpoint on them."""
    rng = random.Random(3)
    for _ in range(24):
        decision = await _select(client, context=[rng.uniform(-1, 1) for _ in range(4)])
        value = 1.0 if decision["arm"] == "arm-1" else 0.0
        response = await client.post(
            "/v1/reward", json={"event_id": decision["event_id"], "value": value}
        )
        assert response.status_code == 200, response.text
    report = await _train(app)
    assert report.version >= 1
    assert report.rewarded == 24
    return report


def _metrics(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


# /select on a cold start ----------------------------------------------------------------


@pytest.mark.anyio
async def test_service_cold_start_selects_uniformly_and_logs(service: Service) -> None:
    client, app = service
    rng = random.Random(0)
    decisions = [
        await _select(client, context=[rng.uniform(-1, 1) for _ in range(4)]) for _ in range(120)
    ]
    for decision in decisions:
        assert decision["policy"] == "cold-start"
        assert decision["model_version"] == 0
        assert decision["propensity"] == 0.25
        assert decision["explore"] is True
        assert [s["arm"] for s in decision["scores"]] == ARMS
        assert all(s["mean"] is s["bonus"] is s["ucb"] is None for s in decision["scores"])
    chosen = Counter(decision["arm"] for decision in decisions)
    assert set(chosen) == set(ARMS)
    # a uniform draw fails once in a million runs; one favoured arm fails
    assert chisquare([chosen[arm] for arm in ARMS]).pvalue > 1e-6, chosen
    assert _count(app, "decisions") == 120
    first = decisions[0]
    row = repository.find_decision(_runtime(app).sessions, first["event_id"])
    assert row is not None
    assert row.arm_id == first["arm"]
    assert row.propensity == 0.25
    assert row.model_version == 0
    assert row.policy == "cold-start"
    assert row.candidates == ARMS
    assert row.scores == [{"arm": a, "mean": None, "bonus": None, "ucb": None} for a in ARMS]
    assert row.explore is True
    assert row.trained_in is None


@pytest.mark.anyio
async def test_service_select_same_event_id_returns_the_same_decision(service: Service) -> None:
    client, app = service
    first = await _select(client, event_id="order-1")
    again = await _select(client, event_id="order-1")
    as_floats = await _select(client, event_id="order-1", context=[float(v) for v in CONTEXT])
    empty_exclude = await _select(client, event_id="order-1", exclude=[])
    assert again == first
    assert as_floats == first
    assert empty_exclude == first  # omitted and empty `exclude` are the same request
    assert _count(app, "decisions") == 1


@pytest.mark.anyio
async def test_service_select_concurrent_same_event_id_stores_one_decision(
    service: Service,
) -> None:
    client, app = service
    async with anyio.create_task_group() as group:
        answers: list[dict[str, Any]] = []

        async def one() -> None:
            answers.append(await _select(client, event_id="race-1"))

        for _ in range(8):
            group.start_soon(one)
    assert len(answers) == 8
    assert all(answer == answers[0] for answer in answers)
    assert _count(app, "decisions") == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "change",
    [
        {"context": [0.0, 0.0, 0.0, 0.0]},
        {"arms": ["arm-0", "arm-1"]},
        {"exclude": ["arm-3"]},
        {"explore": False},
    ],
)
async def test_service_select_same_event_id_different_request_is_409(
    service: Service, change: dict[str, Any]
) -> None:
    client, app = service
    first = await _select(client, event_id="order-2")
    response = await client.post(
        "/v1/select", json={"context": CONTEXT, "event_id": "order-2", **change}
    )
    error = _error(response, 409, "event_id")
    assert error["code"] == "conflict"
    assert _count(app, "decisions") == 1
    row = repository.find_decision(_runtime(app).sessions, "order-2")
    assert row is not None
    assert row.context == CONTEXT
    assert row.arm_id == first["arm"]
    assert await _select(client, event_id="order-2") == first


@pytest.mark.anyio
async def test_service_select_generates_distinct_event_ids(service: Service) -> None:
    client, app = service
    ids = [(await _select(client))["event_id"] for _ in range(6)]
    assert len(set(ids)) == 6
    assert all(ids)
    assert _count(app, "decisions") == 6


@pytest.mark.anyio
async def test_service_select_restricts_to_the_listed_arms(service: Service) -> None:
    client, app = service
    decisions = [await _select(client, arms=["arm-3", "arm-1"]) for _ in range(30)]
    assert {d["arm"] for d in decisions} == {"arm-1", "arm-3"}
    assert all(d["propensity"] == 0.5 for d in decisions)
    assert all([s["arm"] for s in d["scores"]] == ["arm-3", "arm-1"] for d in decisions)
    row = repository.find_decision(_runtime(app).sessions, decisions[0]["event_id"])
    assert row is not None
    assert row.candidates == ["arm-3", "arm-1"]


@pytest.mark.anyio
async def test_service_select_never_chooses_an_excluded_arm(service: Service) -> None:
    client, _ = service
    decisions = [await _select(client, exclude=["arm-0"]) for _ in range(30)]
    assert {d["arm"] for d in decisions} == {"arm-1", "arm-2", "arm-3"}
    assert all(d["propensity"] == pytest.approx(1 / 3) for d in decisions)
    assert all([s["arm"] for s in d["scores"]] == ARMS[1:] for d in decisions)
    only = [await _select(client, arms=["arm-0", "arm-2"], exclude=["arm-0"]) for _ in range(5)]
    assert all(d["arm"] == "arm-2" and d["propensity"] == 1.0 for d in only)


@pytest.mark.anyio
async def test_service_select_logs_explore_false(service: Service) -> None:
    client, app = service
    decision = await _select(client, event_id="no-explore", explore=False)
    assert decision["explore"] is False
    row = repository.find_decision(_runtime(app).sessions, "no-explore")
    assert row is not None
    assert row.explore is False


# /reward -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_service_reward_is_accepted_once_then_duplicate(service: Service) -> None:
    client, app = service
    decision = await _select(client, event_id="rewarded-1")
    body = {"event_id": "rewarded-1", "value": 1.5}
    first = await client.post("/v1/reward", json=body)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "event_id": "rewarded-1",
        "value": 1.5,
        "duplicate": False,
        "late": False,
    }
    again = await client.post("/v1/reward", json=body)
    assert again.status_code == 200, again.text
    assert again.json() == {
        "event_id": "rewarded-1",
        "value": 1.5,
        "duplicate": True,
        "late": False,
    }
    assert _count(app, "rewards") == 1
    assert decision["event_id"] == "rewarded-1"
    conflict = await client.post("/v1/reward", json={"event_id": "rewarded-1", "value": 0.0})
    assert _error(conflict, 409, "value")["code"] == "conflict"
    with _runtime(app).engine.connect() as connection:
        value, repeats = connection.execute(text("select value, repeats from rewards")).one()
    assert (value, repeats) == (1.5, 1)


@pytest.mark.anyio
async def test_service_reward_for_unknown_event_is_404(service: Service) -> None:
    client, app = service
    response = await client.post("/v1/reward", json={"event_id": "never-made", "value": 1.0})
    error = _error(response, 404, "event_id")
    assert error["code"] == "not_found"
    assert "never-made" in error["message"]
    assert _count(app, "rewards") == 0


# After a checkpoint ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_service_select_uses_rofu_after_a_checkpoint(service: Service) -> None:
    client, app = service
    report = await _with_checkpoint(client, app)
    rng = random.Random(5)
    for _ in range(10):
        decision = await _select(client, context=[rng.uniform(-1, 1) for _ in range(4)])
        assert decision["policy"] == "rofu"
        assert decision["model_version"] == report.version
        scores = {s["arm"]: s for s in decision["scores"]}
        assert list(scores) == ARMS
        for s in scores.values():
            assert all(math.isfinite(s[key]) for key in ("mean", "bonus", "ucb"))
            assert s["bonus"] >= 0
            assert s["ucb"] == pytest.approx(s["mean"] + s["bonus"], rel=1e-12, abs=1e-12)
        best = max(scores.values(), key=lambda s: s["ucb"])
        served = {p["arm"]: p["probability"] for p in decision["probabilities"]}
        floor = app.state.runtime.settings.exploration_floor  # the argmax, with the preset's floor
        assert served[best["arm"]] == pytest.approx(1 - floor + floor / len(ARMS), abs=1e-12)
        assert decision["propensity"] == served[decision["arm"]]
    model = (await client.get("/v1/model")).json()
    assert model["version"] == report.version
    assert model["n_data"] == 24
    assert model["checksum"]
    ready = (await client.get("/readyz")).json()
    assert ready["checks"]["model"] == ModelState.LOADED


@pytest.mark.anyio
@pytest.mark.parametrize("estimator", ["exact", "ntk"])
async def test_service_scores_are_rofu_scores_of_the_served_checkpoint(
    sqlite_settings: Settings, estimator: str
) -> None:
    settings = sqlite_settings.model_copy(update={"estimator": estimator, "minibatch_size": 8})
    async with app_client(settings) as (client, app):
        report = await _with_checkpoint(client, app)
        runtime = _runtime(app)
        snapshot = runtime.holder.current
        assert snapshot is not None
        assert snapshot.version == report.version
        first = await _select(client, context=CONTEXT)
        second = await _select(client, context=CONTEXT)
        # A second decision on the same context: `ntk` repeats it exactly (its minibatches
        # come from the checkpoint), `exact` draws new minibatches from the shared stream.
        config = settings.rofu_config()
        generator = checkpoint_generator(settings.seed, report.version)
        basis = ntk_basis(snapshot.net, snapshot.data, config, generator)
        want = rofu_scores(
            snapshot.net,
            torch.tensor([CONTEXT]),
            snapshot.data,
            config,
            torch.Generator().manual_seed(0),
            basis=basis if estimator == "ntk" else None,
        )
    for decision in (first, second):
        got = torch.tensor([[s["mean"] for s in decision["scores"]]], dtype=torch.float64)
        # `want` is on the served network's device (CUDA where present: device `auto`).
        torch.testing.assert_close(got, want.mean[:, :4].double().cpu(), rtol=1e-5, atol=1e-6)
        bonus = torch.tensor([[s["bonus"] for s in decision["scores"]]], dtype=torch.float64)
        if estimator == "ntk":
            want_bonus = want.bonus[:, :4].double().cpu()
            torch.testing.assert_close(bonus, want_bonus, rtol=1e-5, atol=1e-6)
    if estimator == "ntk":
        assert first["scores"] == second["scores"]


@pytest.mark.anyio
async def test_service_select_explore_false_exploits_the_mean(sqlite_settings: Settings) -> None:
    # A large bonus scale makes the optimistic and the greedy choice disagree often.
    settings = sqlite_settings.model_copy(update={"bonus_scale": 20.0})
    async with app_client(settings) as (client, app):
        await _with_checkpoint(client, app)
        rng = random.Random(6)
        disagreements = 0
        for _ in range(20):
            decision = await _select(
                client, context=[rng.uniform(-1, 1) for _ in range(4)], explore=False
            )
            assert decision["explore"] is False
            assert decision["propensity"] == 1.0
            greedy = max(decision["scores"], key=lambda s: s["mean"])
            optimistic = max(decision["scores"], key=lambda s: s["ucb"])
            assert decision["arm"] == greedy["arm"]
            disagreements += greedy["arm"] != optimistic["arm"]
    assert disagreements > 0  # otherwise this test could not tell exploit from explore


@pytest.mark.anyio
async def test_service_select_replays_a_scored_decision_exactly(service: Service) -> None:
    client, app = service
    await _with_checkpoint(client, app)
    first = await _select(client, event_id="scored-1")
    rewarded = await client.post("/v1/reward", json={"event_id": "scored-1", "value": 1.0})
    assert rewarded.status_code == 200, rewarded.text
    newer = await _train(app)  # trains on scored-1 and serves a newer checkpoint
    assert newer.version == first["model_version"] + 1
    assert (await client.get("/v1/model")).json()["version"] == newer.version
    assert await _select(client, event_id="scored-1") == first


# The arm catalogue ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_service_added_arm_is_selectable_at_once(service: Service) -> None:
    client, app = service
    await _with_checkpoint(client, app)
    response = await client.post("/v1/arms", json={"id": "arm-new"})
    assert response.status_code == 201, response.text
    assert response.json() == {"id": "arm-new", "slot": 4, "features": None, "active": True}
    decision = await _select(client)
    scores = {s["arm"]: s for s in decision["scores"]}
    assert list(scores) == [*ARMS, "arm-new"]
    assert math.isfinite(scores["arm-new"]["ucb"])
    alone = await _select(client, arms=["arm-new"])
    assert alone["arm"] == "arm-new"
    assert alone["propensity"] == 1.0
    listed = (await client.get("/v1/arms")).json()
    assert [arm["id"] for arm in listed] == [*ARMS, "arm-new"]


@pytest.mark.anyio
async def test_service_add_arm_twice_is_409(service: Service) -> None:
    client, app = service
    assert (await client.post("/v1/arms", json={"id": "arm-x"})).status_code == 201
    for arm_id in ("arm-x", "arm-0"):
        response = await client.post("/v1/arms", json={"id": arm_id})
        error = _error(response, 409, "id", named=False)
        assert error["code"] == "conflict"
        assert arm_id in error["message"]
    assert _count(app, "arms") == 5


@pytest.mark.anyio
async def test_service_full_catalogue_refuses_a_new_arm(sqlite_settings: Settings) -> None:
    settings = sqlite_settings.model_copy(update={"max_arms": 4})  # the 4 demo arms fill it
    async with app_client(settings) as (client, app):
        response = await client.post("/v1/arms", json={"id": "arm-4"})
        error = _error(response, 409, "id", named=False)
        assert "max_arms=4" in error["message"]
        assert _count(app, "arms") == 4


@pytest.mark.anyio
async def test_service_retired_arm_is_never_selected(service: Service) -> None:
    client, app = service
    response = await client.delete("/v1/arms/arm-2")
    assert response.status_code == 200, response.text
    assert response.json()["active"] is False
    decisions = [await _select(client) for _ in range(40)]
    assert {d["arm"] for d in decisions} == {"arm-0", "arm-1", "arm-3"}
    assert all("arm-2" not in [s["arm"] for s in d["scores"]] for d in decisions)
    assert all(d["propensity"] == pytest.approx(1 / 3) for d in decisions)
    for arms in (["arm-2"], ["arm-1", "arm-2"]):
        refused = await client.post("/v1/select", json={"context": CONTEXT, "arms": arms})
        field = f"arms.{arms.index('arm-2')}"  # the retired arm's index
        assert "retired" in _error(refused, 422, field)["message"]
    assert (await client.delete("/v1/arms/arm-2")).status_code == 200  # retiring again: no-op
    assert _count(app, "decisions") == 40


@pytest.mark.anyio
async def test_service_retired_arm_is_never_selected_by_rofu(service: Service) -> None:
    client, app = service
    await _with_checkpoint(client, app)
    assert (await client.delete("/v1/arms/arm-1")).status_code == 200  # the paying arm
    decisions = [await _select(client, context=[0.1 * i, 0, 0, 0]) for i in range(10)]
    assert all(d["policy"] == "rofu" and d["arm"] != "arm-1" for d in decisions)
    assert all([s["arm"] for s in d["scores"]] == ["arm-0", "arm-2", "arm-3"] for d in decisions)


@pytest.mark.anyio
async def test_service_unknown_arm_is_refused(service: Service) -> None:
    client, app = service
    gone = await client.delete("/v1/arms/ghost")
    assert "ghost" in _error(gone, 404, "id", named=False)["message"]
    for key in ("arms", "exclude"):
        body = {"context": CONTEXT, key: ["arm-0", "ghost"]}
        response = await client.post("/v1/select", json=body)
        assert "ghost" in _error(response, 422, f"{key}.1")["message"]
        repeated = {"context": CONTEXT, key: ["arm-1", "arm-0", "arm-1"]}
        response = await client.post("/v1/select", json=repeated)
        assert "repeated" in _error(response, 422, f"{key}.2")["message"]
    assert _count(app, "decisions") == 0


# Health, metrics, OpenAPI ----------------------------------------------------------------


@pytest.mark.anyio
async def test_service_health_endpoints(service: Service) -> None:
    client, _ = service
    alive = await client.get("/healthz")
    assert alive.status_code == 200
    assert alive.json()["status"] == "ok"
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": "ok", "model": ModelState.COLD_START},
    }


@pytest.mark.anyio
async def test_service_readyz_is_503_without_a_database(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, app = service
    down = DatabaseStatus("unreachable", "connection", "OperationalError: refused")
    monkeypatch.setattr(_runtime(app), "_probe_database", lambda: down)
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "unreachable"
    assert response.json()["checks"]["database_cause"] == "connection"


@pytest.mark.anyio
async def test_service_metrics_count_requests_and_outcomes(service: Service) -> None:
    client, _ = service
    decision = await _select(client)
    body = {"event_id": decision["event_id"], "value": 1.0}
    await client.post("/v1/reward", json=body)
    await client.post("/v1/reward", json=body)
    await client.post("/v1/reward", json={"event_id": "ghost", "value": 1.0})
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _metrics(response.text)
    names = {name for name, _ in samples}
    for name in (
        "rofu_http_requests_total",
        "rofu_select_batch_size_count",
        "rofu_selections_total",
        "rofu_rewards_total",
        "rofu_model_version",
        "rofu_checkpoint_age_seconds",
    ):
        assert name in names, name
    request = (("endpoint", "/v1/select"), ("method", "POST"), ("status", "200"))
    assert samples[("rofu_http_requests_total", request)] == 1
    assert samples[("rofu_select_batch_size_count", ())] == 1
    assert samples[("rofu_select_batch_size_sum", ())] == 1
    chosen = (("arm", decision["arm"]), ("policy", "cold-start"))
    assert samples[("rofu_selections_total", chosen)] == 1
    for outcome in ("accepted", "duplicate", "unknown_event"):
        assert samples[("rofu_rewards_total", (("outcome", outcome),))] == 1
    assert samples[("rofu_model_version", ())] == 0
    assert samples[("rofu_checkpoint_age_seconds", ())] == 0


@pytest.mark.anyio
async def test_service_metrics_report_the_served_model(service: Service) -> None:
    client, app = service
    report = await _with_checkpoint(client, app)
    samples = _metrics((await client.get("/metrics")).text)
    assert samples[("rofu_model_version", ())] == report.version
    assert samples[("rofu_checkpoint_age_seconds", ())] >= 0
    assert samples[("rofu_checkpoint_swaps_total", ())] == 1


@pytest.mark.anyio
async def test_service_openapi_lists_the_api(service: Service) -> None:
    client, _ = service
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    for path in (
        "/v1/select",
        "/v1/reward",
        "/v1/arms",
        "/v1/arms/{arm_id}",
        "/v1/model",
        "/v1/events/{event_id}/activate",
        "/readyz",
    ):
        assert path in paths, path
    assert "post" in paths["/v1/select"]
    assert "post" in paths["/v1/reward"]
    assert {"get", "post"} <= set(paths["/v1/arms"])
    assert "422" in paths["/v1/select"]["post"]["responses"]
    request = schema["components"]["schemas"]["SelectRequest"]
    assert set(request["properties"]) == {
        "context",
        "event_id",
        "arms",
        "exclude",
        "explore",
        "baseline_arm",
        "unit_id",
        "defer",
        "explain",
        "arm_features",
    }
    assert request["required"] == ["context"]


@pytest.mark.anyio
async def test_service_shutdown_waits_for_the_poll_loops_database_work(
    sqlite_settings: Settings,
) -> None:
    """A poll caught mid-query at shutdown finishes before the engine is disposed.

    Cancelling the poll task does not stop its worker thread; were `aclose` not to wait,
    that thread would check its connection in to the disposed pool, where it stays open.
    """
    started, finished = anyio.Event(), []
    settings = sqlite_settings.model_copy(update={"checkpoint_poll_seconds": 0.01})
    async with app_client(settings) as (_, app):
        runtime = _runtime(app)
        refresh = runtime.catalogue.fresh
        loop = asyncio.get_running_loop()

        def slow_fresh() -> object:
            loop.call_soon_threadsafe(started.set)
            time.sleep(0.5)
            finished.append(refresh())
            return finished[-1]

        runtime.catalogue.fresh = slow_fresh  # type: ignore[method-assign]
        await started.wait()
    assert len(finished) == 1


@pytest.mark.anyio
async def test_service_failed_start_releases_the_database(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise RuntimeError("no checkpoint can be read")

    app = create_app(sqlite_settings)
    runtime = _runtime(app)
    monkeypatch.setattr(runtime.follower, "load_initial", fail)
    with pytest.raises(RuntimeError, match="no checkpoint can be read"):
        async with app.router.lifespan_context(app):
            pass
    assert runtime.engine.pool.checkedin() == 0  # disposed: no connection left open


@pytest.mark.anyio
async def test_model_times_are_iso_8601_utc(sqlite_settings: Settings) -> None:
    async with app_client(sqlite_settings) as (client, _):
        cold = (await client.get("/v1/model")).json()
    assert (cold["version"], cold["created_at"], cold["age_seconds"]) == (0, None, None)
    before = datetime.now(UTC)
    seed_checkpoint(sqlite_settings, n_rows=20, version=1)
    async with app_client(sqlite_settings) as (client, _):
        model = (await client.get("/v1/model")).json()
        (stored,) = (await client.get("/v1/model/checkpoints")).json()
    for stamp in (model["created_at"], stored["created_at"]):
        assert isinstance(stamp, str), stamp
        assert stamp.endswith("Z"), stamp
        made = datetime.fromisoformat(stamp)
        assert made.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=5) <= made <= datetime.now(UTC)
    assert model["age_seconds"] >= 0


@pytest.mark.anyio
async def test_model_checkpoints_are_paged_with_a_next_link(sqlite_settings) -> None:
    for version in range(1, 8):
        seed_checkpoint(sqlite_settings, n_rows=20, version=version)
    async with app_client(sqlite_settings) as (client, _):
        pages, url = [], "/v1/model/checkpoints?limit=3"
        while url:
            page = await client.get(url)
            assert page.status_code == 200, page.text
            pages.append([c["version"] for c in page.json()])
            link = page.headers.get("link")
            url = link[1 : link.index(">")] if link else ""
        assert pages == [[7, 6, 5], [4, 3, 2], [1]]
        everything = (await client.get("/v1/model/checkpoints")).json()
        assert [c["version"] for c in everything] == [7, 6, 5, 4, 3, 2, 1]
        for bad in ("limit=0", "limit=501", "before=0", "limit=x", "before=10000000000000000001"):
            refused = await client.get(f"/v1/model/checkpoints?{bad}")
            assert refused.status_code == 422, bad


@pytest.mark.anyio
async def test_a_body_not_sent_as_json_is_a_415_naming_the_content_type(
    service: Service,
) -> None:
    client, app = service
    body = b'{"context": [0.1, 0.2, 0.3, 0.4]}'
    for headers, got in (({"content-type": "text/plain"}, "'text/plain'"), ({}, "none")):
        refused = await client.post("/v1/select", content=body, headers=headers)
        error = _error(refused, 415, "content-type")
        assert error["code"] == "unsupported_media_type"
        assert error["message"] == (f"body: the content-type must be application/json (got {got})")
    missing = await client.post("/v1/select")  # no body at all: the body is missing
    assert _error(missing, 422, "body")["code"] == "invalid_input"
    accepted = await client.post(
        "/v1/select", content=body, headers={"content-type": "application/json"}
    )
    assert accepted.status_code == 200
    assert _count(app, "decisions") == 1
