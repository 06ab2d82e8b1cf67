"""Under load a replica fails fast rather than queue: past ROFU_SELECT_QUEUE_MAX held
/select (and Rank) requests, one more is a 503 `overloaded` with Retry-After at once,
while the batch ahead of it is still being scored; nothing is stored for it.

Scoring is held on an event in the batcher's worker thread, so the queue stays full for
as long as a test needs; every assertion is about who was answered before the release,
never how long anything took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from rofu.client import AsyncRofuClient, RofuError
from rofu.service.deciding import batch as decision_batch
from rofu.service.settings import Settings
from tests.personalizer import PREFIX, RANK, with_arms
from tests.support import app_client, eventually

BOUND = 3
HOLD_GUARD_S = 30  # a held batch is released by then even if a test fails to release it
CONTEXT = [0.1, 0.2, 0.3, 0.4]


@pytest.fixture
def settings(sqlite_settings: Settings) -> Settings:
    """Batches of 2 taken at once, at most BOUND requests held, the Rank examples' arms."""
    return with_arms(sqlite_settings).model_copy(
        update={"batch_max_size": 2, "batch_max_wait_ms": 0.0, "select_queue_max": BOUND}
    )


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold every decision batch (scoring and storing) until the event is set."""
    event, decide = threading.Event(), decision_batch.DecisionBatch.__call__

    def held(self: decision_batch.DecisionBatch, items: list[Any]) -> list[Any]:
        event.wait(HOLD_GUARD_S)
        return decide(self, items)

    monkeypatch.setattr(decision_batch.DecisionBatch, "__call__", held)
    yield event
    event.set()


def _select(event_id: str) -> dict[str, Any]:
    return {"context": CONTEXT, "event_id": event_id}


def _rank(event_id: str) -> dict[str, Any]:
    return {**RANK, "eventId": event_id}


def _sample(app: FastAPI, name: str) -> float | None:
    return app.state.runtime.metrics.registry.get_sample_value(name)  # type: ignore[no-any-return]


async def _scraped(client: httpx.AsyncClient) -> dict[str, float]:
    """The queue's gauge and the refusals' counter as GET /metrics exports them."""
    body = (await client.get("/metrics")).text
    wanted = ("rofu_select_queue_depth", "rofu_select_shed_total")
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name in wanted
    }


def _database_errors(app: FastAPI) -> float:
    registry = app.state.runtime.metrics.registry
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "rofu_database_errors_total"
    )


def _stored(app: FastAPI) -> set[str]:
    with app.state.runtime.engine.connect() as connection:
        rows = connection.execute(text("select event_id from decisions")).scalars()
        return set(rows)


async def _fill(
    client: httpx.AsyncClient, app: FastAPI, requests: list[tuple[str, dict[str, Any]]]
) -> list[asyncio.Task[httpx.Response]]:
    """Post `requests` concurrently and wait until the replica holds every one."""
    tasks = [asyncio.create_task(client.post(path, json=body)) for path, body in requests]
    await eventually(lambda: _sample(app, "rofu_select_queue_depth") == len(requests))
    return tasks


@pytest.mark.anyio
async def test_select_past_the_bound_is_refused_while_the_held_batch_still_scores(
    settings: Settings, release: threading.Event
) -> None:
    async with app_client(settings) as (client, app):
        assert await _scraped(client) == {
            "rofu_select_queue_depth": 0.0,
            "rofu_select_shed_total": 0.0,
        }
        held = [f"held-{i}" for i in range(BOUND)]
        accepted = await _fill(client, app, [("/v1/select", _select(key)) for key in held])
        refused = [await client.post("/v1/select", json=_select(f"shed-{i}")) for i in range(2)]
        assert not release.is_set()
        assert not any(task.done() for task in accepted)  # answered ahead of the held ones
        for answer in refused:
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            error = answer.json()["error"]
            assert (error["code"], error["field"]) == ("overloaded", None)
            assert "ROFU_SELECT_QUEUE_MAX" in error["message"]
        assert await _scraped(client) == {
            "rofu_select_queue_depth": float(BOUND),
            "rofu_select_shed_total": 2.0,
        }
        release.set()
        answers = await asyncio.gather(*accepted)
        assert [answer.status_code for answer in answers] == [200] * BOUND
        assert _stored(app) == set(held)
        assert await _scraped(client) == {
            "rofu_select_queue_depth": 0.0,
            "rofu_select_shed_total": 2.0,
        }
        assert _database_errors(app) == 0.0  # a refusal is no database failure
        retried = await client.post("/v1/select", json=_select("shed-0"))  # room again
        assert retried.status_code == 200, retried.text
        assert _stored(app) == {*held, "shed-0"}


@pytest.mark.anyio
async def test_rank_shares_the_bound_and_is_refused_in_personalizers_shape(
    settings: Settings, release: threading.Event
) -> None:
    async with app_client(settings) as (client, app):
        held = [f"rank-{i}" for i in range(BOUND)]
        accepted = await _fill(client, app, [(f"{PREFIX}/rank", _rank(key)) for key in held])
        rank = await client.post(f"{PREFIX}/rank", json=_rank("rank-shed"))
        select = await client.post("/v1/select", json=_select("select-shed"))
        assert not release.is_set()
        assert not any(task.done() for task in accepted)
        assert rank.status_code == 503, rank.text
        assert rank.headers["retry-after"] == "1"
        error = rank.json()["error"]
        assert error["code"] == "InternalServerError"
        assert error["innerError"] == {"code": "overloaded"}
        assert select.status_code == 503
        assert select.json()["error"]["code"] == "overloaded"
        assert _sample(app, "rofu_select_shed_total") == 2.0
        release.set()
        answers = await asyncio.gather(*accepted)
        assert [answer.status_code for answer in answers] == [201] * BOUND
        assert _stored(app) == set(held)
        assert _sample(app, "rofu_select_queue_depth") == 0.0


@pytest.mark.anyio
async def test_client_retries_an_overloaded_select_a_bounded_number_of_times(
    settings: Settings, release: threading.Event
) -> None:
    async with app_client(settings) as (client, app):
        held = [f"held-{i}" for i in range(BOUND)]
        accepted = await _fill(client, app, [("/v1/select", _select(key)) for key in held])
        transport = httpx.ASGITransport(app=app)
        sdk = AsyncRofuClient("http://rofu.test", transport=transport, retries=2, max_backoff_s=0)
        async with sdk:
            with pytest.raises(RofuError) as caught:
                await sdk.select(CONTEXT, event_id="sdk-1")
        assert (caught.value.status, caught.value.code) == (503, "overloaded")
        assert _sample(app, "rofu_select_shed_total") == 3.0  # the first try and 2 retries
        assert not release.is_set()
        release.set()
        await asyncio.gather(*accepted)
        assert _stored(app) == set(held)
