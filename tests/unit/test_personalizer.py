"""The Personalizer-compatible facade in-process: the reference's examples (Rank.json,
Events_Reward.json, Events_Activate.json, the multi-slot context) through
/personalizer/v1.0, decided, stored and counted by the same code as /v1, and
Personalizer's key header. Error paths: tests/unit/test_personalizer_errors.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import text

from rofu.service.db import repository
from rofu.service.db.tables import DecisionRow
from rofu.service.deciding.features import featurize
from rofu.service.settings import ArmSpec, Settings
from tests.personalizer import (
    ARMS,
    EVENT_ID,
    EXAMPLE_EVENT,
    MULTI_SLOT_CONTEXT,
    MULTI_SLOT_MERGED,
    PREFIX,
    RANK,
    REWARD,
    assert_error,
    assert_like_the_reference,
    with_arms,
)
from tests.support import app_client, seed_checkpoint

Service = tuple[httpx.AsyncClient, FastAPI]
CLIENT_KEY = "client-key-aaaaaaaaaaaaaaaa"
ADMIN_KEY = "admin-key-bbbbbbbbbbbbbbbbbb"


@pytest.fixture
def settings(sqlite_settings: Settings) -> Settings:
    """The reference's three articles; a 60 s reward window (activation in time)."""
    return with_arms(sqlite_settings).model_copy(update={"reward_window_seconds": 60.0})


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    async with app_client(settings) as pair:
        yield pair


def _row(app: FastAPI, event_id: str) -> DecisionRow:
    return repository.find_decisions(app.state.runtime.sessions, [event_id])[event_id]


def _scalar(app: FastAPI, sql: str) -> Any:
    with app.state.runtime.engine.connect() as connection:
        return connection.execute(text(sql)).scalar()


def _samples(body: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name
    }


@pytest.mark.anyio
async def test_personalizer_rank_example_gives_the_reference_shape(service: Service) -> None:
    client, app = service
    response = await client.post(f"{PREFIX}/rank", json=RANK)
    assert response.status_code == 201, response.text
    body = response.json()
    assert_like_the_reference(body, RANK)
    assert body["eventId"] == EVENT_ID
    assert [item["id"] for item in body["ranking"]][-1] == "SportsArticle"  # 0: last
    row = _row(app, EVENT_ID)  # the decision /v1 stores, with /v1's hashed context
    assert row.candidates == ["NewsArticle", "EntertainmentArticle"]
    assert row.arm_id == body["rewardActionId"]
    assert row.named_context == {"timeOfDay": "Morning"}
    assert row.context == featurize({"timeOfDay": "Morning"}, 4, 0)
    ranked = {item["id"]: item["probability"] for item in body["ranking"]}
    assert [ranked[arm] for arm in row.candidates] == row.probabilities
    assert (row.deferred, row.arm_features) == (False, None)  # per-arm model: ignored
    selections = _samples((await client.get("/metrics")).text, "rofu_selections_total")
    assert sum(selections.values()) == 1  # counted like /v1/select


@pytest.mark.anyio
async def test_personalizer_rank_is_idempotent_on_the_event_id(service: Service) -> None:
    client, app = service
    first = await client.post(f"{PREFIX}/rank", json=RANK)
    again = await client.post(f"{PREFIX}/rank", json=RANK)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    # the same request in another form: contexts split otherwise, actions' features ignored
    split = {**RANK, "contextFeatures": [{"timeOfDay": "Morning"}, {"timeOfDay": "Morning"}]}
    assert (await client.post(f"{PREFIX}/rank", json=split)).json() == first.json()
    other = {**RANK, "contextFeatures": [{"timeOfDay": "Evening"}]}
    clash = await client.post(f"{PREFIX}/rank", json=other)
    error = assert_error(clash, 409, "eventId")
    assert "already used for a different request" in error["message"]
    assert error["innerError"] == {"code": "conflict"}
    undeferred = await client.post(f"{PREFIX}/rank", json={**RANK, "deferActivation": True})
    assert_error(undeferred, 409, "eventId")
    assert _scalar(app, "select count(*) from decisions") == 1


@pytest.mark.anyio
async def test_personalizer_rank_generates_an_event_id(service: Service) -> None:
    client, app = service
    request = {key: value for key, value in RANK.items() if key != "eventId"}
    made = [await client.post(f"{PREFIX}/rank", json=request) for _ in range(2)]
    assert [response.status_code for response in made] == [201, 201]
    ids = [response.json()["eventId"] for response in made]
    assert ids[0] != ids[1]
    for response in made:
        assert_like_the_reference(response.json(), request)
    assert _row(app, ids[0]).candidates == ["NewsArticle", "EntertainmentArticle"]


@pytest.mark.anyio
async def test_personalizer_rank_has_rofus_exact_probabilities(settings: Settings) -> None:
    seed_checkpoint(settings)  # a model: ROFU's rule, not the cold start's uniform draw
    context = MULTI_SLOT_CONTEXT
    request = {**RANK, "contextFeatures": context, "excludedActions": ["NewsArticle"]}
    async with app_client(settings) as (client, _):
        ranked = await client.post(f"{PREFIX}/rank", json=request)
        selected = await client.post(
            "/v1/select",
            json={"context": MULTI_SLOT_MERGED, "arms": ["SportsArticle", "EntertainmentArticle"]},
        )
    assert (ranked.status_code, selected.status_code) == (201, 200), ranked.text
    assert selected.json()["policy"] == "rofu"
    assert_like_the_reference(ranked.json(), request)
    probabilities = {item["id"]: item["probability"] for item in ranked.json()["ranking"]}
    expected = {p["arm"]: p["probability"] for p in selected.json()["probabilities"]}
    assert probabilities == {**expected, "NewsArticle": 0.0}


@pytest.mark.anyio
async def test_personalizer_multi_slot_context_is_merged_and_hashed(service: Service) -> None:
    client, app = service
    request = {**RANK, "contextFeatures": MULTI_SLOT_CONTEXT, "eventId": "multi-1"}
    response = await client.post(f"{PREFIX}/rank", json=request)
    assert response.status_code == 201, response.text
    assert_like_the_reference(response.json(), request)
    row = _row(app, "multi-1")
    assert row.named_context == MULTI_SLOT_MERGED
    assert row.context == featurize(MULTI_SLOT_MERGED, 4, 0)
    assert any(row.context)
    # one object with every namespace is the same request: it replays the decision
    together = {**request, "contextFeatures": [MULTI_SLOT_MERGED]}
    assert (await client.post(f"{PREFIX}/rank", json=together)).json() == response.json()


@pytest.mark.anyio
async def test_personalizer_reward_example_stores_the_reward(service: Service) -> None:
    client, app = service
    ranked = await client.post(f"{PREFIX}/rank", json={**RANK, "eventId": EXAMPLE_EVENT})
    assert ranked.status_code == 201, ranked.text
    response = await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/reward", json=REWARD)
    assert (response.status_code, response.content) == (204, b"")
    assert _scalar(app, "select value from rewards where event_id = 'id'") == 1.0
    repeat = await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/reward", json=REWARD)
    assert repeat.status_code == 204  # the same value again: a harmless duplicate
    text_body = (await client.get("/metrics")).text
    outcomes = _samples(text_body, "rofu_rewards_total")
    assert outcomes[(("outcome", "accepted"),)] == 1
    assert outcomes[(("outcome", "duplicate"),)] == 1
    rewarded = _samples(text_body, "rofu_rewarded_decisions_total")
    assert sum(rewarded.values()) == 1  # the business metrics, once
    arm = ranked.json()["rewardActionId"]
    assert rewarded[(("arm", arm), ("policy", "cold-start"))] == 1
    v1 = await client.post("/v1/reward", json={"event_id": EXAMPLE_EVENT, "value": 1.0})
    assert v1.json()["duplicate"] is True  # one store behind both APIs
    assert _scalar(app, "select count(*) from rewards") == 1


@pytest.mark.anyio
async def test_personalizer_reward_with_another_value_is_accepted_and_ignored(
    service: Service,
) -> None:
    client, app = service
    ranked = await client.post(f"{PREFIX}/rank", json={**RANK, "eventId": EXAMPLE_EVENT})
    assert ranked.status_code == 201, ranked.text
    first = await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/reward", json={"value": 0.25})
    others = [
        await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/reward", json={"value": value})
        for value in (1.0, -1.0)
    ]
    # as Personalizer's default (rewardAggregation "earliest"): every post a 204, the first
    # value kept, the others counted as repeats of the row and in the metrics
    assert [r.status_code for r in (first, *others)] == [204, 204, 204]
    assert all(r.content == b"" for r in others)
    stored = "select value, repeats from rewards where event_id = 'id'"
    with app.state.runtime.engine.connect() as connection:
        assert tuple(connection.execute(text(stored)).one()) == (0.25, 2)
    text_body = (await client.get("/metrics")).text
    outcomes = _samples(text_body, "rofu_rewards_total")
    assert outcomes[(("outcome", "accepted"),)] == 1
    assert outcomes[(("outcome", "ignored"),)] == 2
    assert outcomes.get((("outcome", "conflict"),), 0) == 0
    value = _samples(text_body, "rofu_reward_value_total")
    assert sum(value.values()) == 0.25  # the first value alone reaches the business metrics
    # /v1/reward keeps its own rule: another value is a 409 and changes nothing
    v1 = await client.post("/v1/reward", json={"event_id": EXAMPLE_EVENT, "value": 0.5})
    assert (v1.status_code, v1.json()["error"]["code"]) == (409, "conflict")
    with app.state.runtime.engine.connect() as connection:
        assert tuple(connection.execute(text(stored)).one()) == (0.25, 2)


@pytest.mark.anyio
async def test_personalizer_activate_example_activates_a_deferred_rank(service: Service) -> None:
    client, app = service
    request = {**RANK, "eventId": EXAMPLE_EVENT, "deferActivation": True}
    ranked = await client.post(f"{PREFIX}/rank", json=request)
    assert ranked.status_code == 201, ranked.text
    row = _row(app, EXAMPLE_EVENT)
    assert (row.deferred, row.activated_at) == (True, None)
    response = await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/activate")
    assert (response.status_code, response.content) == (204, b"")
    row = _row(app, EXAMPLE_EVENT)
    assert row.activated_at is not None
    assert row.activation_late is False
    again = await client.post(f"{PREFIX}/events/{EXAMPLE_EVENT}/activate")
    assert again.status_code == 204  # idempotent
    v1 = await client.post(f"/v1/events/{EXAMPLE_EVENT}/activate")
    assert (v1.json()["status"], v1.json()["duplicate"]) == ("already_active", True)
    deferred = _samples((await client.get("/metrics")).text, "rofu_deferred_decisions_total")
    assert deferred[(("event", "deferred"),)] == deferred[(("event", "activated"),)] == 1


@pytest.mark.anyio
async def test_personalizer_action_features_feed_an_arm_feature_model(
    sqlite_settings: Settings,
) -> None:
    arms = [ArmSpec(id=arm, features=[1.0, 0.0, 0.0]) for arm in ARMS]
    settings = sqlite_settings.model_copy(update={"arms": arms, "arm_feature_dim": 3})
    request = {**RANK, "eventId": "features-1"}
    request["actions"] = [*RANK["actions"][:2], {"id": "EntertainmentArticle", "features": []}]
    request["actions"][0] = {
        "id": "NewsArticle",
        "features": [{"type": "News"}, {"meta": {"words": 350, "tags": ["a", "b"]}}],
    }
    async with app_client(settings) as (client, app):
        response = await client.post(f"{PREFIX}/rank", json=request)
        assert response.status_code == 201, response.text
        row = _row(app, "features-1")
    assert_like_the_reference(response.json(), request)
    named = {"type": "News", "meta": {"words": 350.0, "tags": ["a", "b"]}}
    # NewsArticle's features hashed into arm_feature_dim; SportsArticle is excluded and
    # EntertainmentArticle (features: []) keeps the catalogue's
    assert row.arm_features == {"NewsArticle": featurize(named, 3, 0)}


@pytest.mark.anyio
async def test_personalizer_apprentice_mode_serves_the_first_action(settings: Settings) -> None:
    apprentice = settings.model_copy(update={"learning_mode": "apprentice"})
    request = {**RANK, "excludedActions": ["NewsArticle"], "eventId": "apprentice-1"}
    async with app_client(apprentice) as (client, app):
        response = await client.post(f"{PREFIX}/rank", json=request)
        row = _row(app, "apprentice-1")
    assert response.status_code == 201, response.text
    body = response.json()
    assert_like_the_reference(body, request)
    assert body["ranking"][0] == {"id": "SportsArticle", "probability": 1.0}
    assert (row.baseline_arm, row.policy) == ("SportsArticle", "apprentice")


@pytest.mark.anyio
async def test_personalizer_takes_the_subscription_key_header(settings: Settings) -> None:
    keyed = settings.model_copy(
        update={"api_keys": [SecretStr(CLIENT_KEY)], "admin_api_keys": [SecretStr(ADMIN_KEY)]}
    )
    subscription = "Ocp-Apim-Subscription-Key"
    async with app_client(keyed) as (client, app):
        missing = await client.post(f"{PREFIX}/rank", json=RANK)
        wrong = await client.post(f"{PREFIX}/rank", json=RANK, headers={subscription: "nope"})
        unrewarded = await client.post(
            f"{PREFIX}/events/{EVENT_ID}/reward", json=REWARD, headers={subscription: "nope"}
        )
        assert _scalar(app, "select count(*) from decisions") == 0
        made = await client.post(f"{PREFIX}/rank", json=RANK, headers={subscription: CLIENT_KEY})
        bearer = await client.post(
            f"{PREFIX}/rank", json=RANK, headers={"Authorization": f"Bearer {CLIENT_KEY}"}
        )
        admin = await client.post(
            f"{PREFIX}/events/{EVENT_ID}/reward", json=REWARD, headers={subscription: ADMIN_KEY}
        )
        v1 = await client.post(
            "/v1/select", json={"context": {}}, headers={subscription: CLIENT_KEY}
        )
    for refused in (missing, wrong, unrewarded):
        error = assert_error(refused, 401, None)
        assert error["innerError"] == {"code": "unauthorized"}
        assert refused.headers["www-authenticate"] == "Bearer"
    assert "Ocp-Apim-Subscription-Key" in missing.json()["error"]["message"]
    assert "not valid" in wrong.json()["error"]["message"]
    assert (made.status_code, bearer.status_code, admin.status_code) == (201, 201, 204)
    assert bearer.json() == made.json()
    # Personalizer's header is the facade's alone: /v1 keeps its own error shape and keys
    assert v1.status_code == 401
    assert v1.json()["error"]["code"] == "unauthorized"
