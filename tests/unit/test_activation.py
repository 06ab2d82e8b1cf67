"""Deferred activation through the API: `defer` on /v1/select, then
POST /v1/events/{event_id}/activate, idempotent and honest about what it did."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from rofu.service.db.tables import DecisionRow, utcnow
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.settings import Settings
from tests.support import app_client

CONTEXT = [0.5, -0.25, 1.0, 0.0]
Service = tuple[httpx.AsyncClient, FastAPI]


@pytest.fixture
async def service(sqlite_settings: Settings) -> AsyncIterator[Service]:
    """The API with a 60 s reward window."""
    settings = sqlite_settings.model_copy(update={"reward_window_seconds": 60.0})
    async with app_client(settings) as pair:
        yield pair


async def _select(client: httpx.AsyncClient, event_id: str, **extra: Any) -> dict[str, Any]:
    body = {"context": CONTEXT, "event_id": event_id, **extra}
    response = await client.post("/v1/select", json=body)
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()
    return decision


async def _activate(client: httpx.AsyncClient, event_id: str) -> dict[str, Any]:
    response = await client.post(f"/v1/events/{event_id}/activate")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _deferred_counts(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {
        sample.labels["event"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rofu_deferred_decisions_total"
    }


def _age(app: FastAPI, event_id: str, seconds: float) -> None:
    """Make a stored decision `seconds` old."""
    with app.state.runtime.sessions() as session, session.begin():
        session.execute(
            update(DecisionRow)
            .where(DecisionRow.event_id == event_id)
            .values(created_at=utcnow() - timedelta(seconds=seconds))
        )


@pytest.mark.anyio
async def test_activation_activates_once_and_says_so_when_repeated(service: Service) -> None:
    client, _ = service
    decision = await _select(client, "shown", defer=True)
    assert decision["deferred"] is True
    first = await _activate(client, "shown")
    assert first["status"] == "activated"
    assert (first["deferred"], first["duplicate"]) == (True, False)
    assert first["activated_at"] is not None
    again = await _activate(client, "shown")
    assert again == {**first, "status": "already_active", "duplicate": True}
    assert await _select(client, "shown", defer=True) == decision  # the key replays it
    assert await _deferred_counts(client) == {
        "deferred": 1,
        "activated": 1,
        "late": 0,
        "expired": 0,
    }


@pytest.mark.anyio
async def test_activating_a_decision_never_deferred_is_a_no_op(service: Service) -> None:
    client, _ = service
    assert (await _select(client, "plain"))["deferred"] is False
    answer = await _activate(client, "plain")
    assert answer == {
        "event_id": "plain",
        "status": "already_active",
        "deferred": False,
        "activated_at": None,
        "duplicate": False,
    }
    assert (await _deferred_counts(client))["activated"] == 0


@pytest.mark.anyio
async def test_activation_refuses_unknown_and_malformed_event_ids(service: Service) -> None:
    client, _ = service
    unknown = await client.post("/v1/events/nobody/activate")
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": {
            "code": "not_found",
            "message": "no decision with event_id 'nobody'",
            "field": "event_id",
        }
    }
    malformed = await client.post("/v1/events/bad%20id!/activate")
    assert malformed.status_code == 422
    assert malformed.json()["error"]["field"] == "event_id"
    assert await _deferred_counts(client) == dict.fromkeys(
        ("deferred", "activated", "late", "expired"), 0
    )


@pytest.mark.anyio
async def test_defer_is_part_of_the_idempotency_key(service: Service) -> None:
    client, _ = service
    await _select(client, "k", defer=True)
    body = {"context": CONTEXT, "event_id": "k"}
    conflict = await client.post("/v1/select", json=body)  # same key, not deferred
    assert conflict.status_code == 409
    assert conflict.json()["error"]["field"] == "event_id"
    await _select(client, "k2")
    conflict = await client.post("/v1/select", json={**body, "event_id": "k2", "defer": True})
    assert conflict.status_code == 409
    refused = await client.post("/v1/select", json={**body, "event_id": "k3", "defer": "yes"})
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "defer"


@pytest.mark.anyio
async def test_activation_after_the_window_is_late_and_stored(service: Service) -> None:
    client, app = service
    await _select(client, "slow", defer=True)
    _age(app, "slow", 61.0)
    late = await _activate(client, "slow")
    assert (late["status"], late["duplicate"], late["activated_at"] is not None) == (
        "late",
        False,
        True,
    )
    repeat = await _activate(client, "slow")
    assert repeat == {**late, "duplicate": True}  # still late: never trained on
    assert (await _deferred_counts(client))["late"] == 1


@pytest.mark.anyio
async def test_activation_after_the_trainer_consumed_the_decision_is_late(
    sqlite_settings: Settings,
) -> None:
    async with app_client(sqlite_settings) as (client, app):  # a window of 0 s
        await _select(client, "expires", defer=True)
        reward = await client.post("/v1/reward", json={"event_id": "expires", "value": 1.0})
        assert reward.json()["late"] is False  # a reward may come before the activation
        runtime = app.state.runtime
        trainer = Trainer(
            runtime.settings, runtime.sessions, runtime.store, runtime.local_bus, runtime.metrics
        )
        report = await anyio.to_thread.run_sync(trainer.run_once)
        assert report is not None
        assert (report.expired, report.rewarded, report.loss) == (1, 0, None)
        late = await _activate(client, "expires")
        assert late["status"] == "late"
        assert await _deferred_counts(client) == {
            "deferred": 1,
            "activated": 0,
            "late": 1,
            "expired": 1,
        }
