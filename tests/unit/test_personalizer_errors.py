"""Every error of the Personalizer-compatible facade is Personalizer's ErrorResponse
naming the offending field of the Personalizer request, and changes nothing; the merge of
feature lists and the renaming of rofu's fields, alone."""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from rofu.client.schemas import ArmProbability, SelectResponse
from rofu.service.errors import Conflict, InvalidInput
from rofu.service.personalizer.facade import Fields, ranking, translate
from rofu.service.personalizer.features import merge
from rofu.service.personalizer.schemas import ErrorCode, RankRequest, error_code
from rofu.service.settings import Settings
from tests.personalizer import ARMS, EVENT_ID, PREFIX, RANK, assert_error, with_arms
from tests.support import app_client

Service = tuple[httpx.AsyncClient, FastAPI]


@pytest.fixture
def settings(sqlite_settings: Settings) -> Settings:
    return with_arms(sqlite_settings)


@pytest.fixture
async def service(settings: Settings) -> AsyncIterator[Service]:
    async with app_client(settings) as pair:
        yield pair


def _count(app: FastAPI, table: str) -> int:
    with app.state.runtime.engine.connect() as connection:
        return int(connection.execute(text(f"select count(*) from {table}")).scalar_one())


def _edited(**changes: Any) -> dict[str, Any]:
    """RANK with top-level changes; a value None removes the field."""
    body = copy.deepcopy(RANK)
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


GHOST = {"id": "Ghost", "features": []}
DEEP = [{"user": {"address": {"city": "Paris"}}}]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "target", "words"),
    [
        (_edited(actions=None), "actions", "Field required"),
        (_edited(actions=[]), "actions", "at least 1"),
        (_edited(actions={"id": "NewsArticle"}), "actions", "valid list"),
        (_edited(actions=[{"id": "NewsArticle"}]), "actions.0.features", "Field required"),
        (_edited(actions=[{"id": "", "features": []}]), "actions.0.id", "at least 1"),
        (_edited(slots=[]), "slots", "Extra inputs"),
        (_edited(deferActivation="true"), "deferActivation", "valid boolean"),
        (_edited(contextFeatures={"timeOfDay": "Morning"}), "contextFeatures", "valid list"),
        (_edited(contextFeatures=["Morning"]), "contextFeatures.0", "valid dictionary"),
        (_edited(eventId="not an id"), "eventId", "'not an id' is not a rofu event id"),
        (_edited(eventId="x" * 129), "eventId", "1-128 characters"),
        (_edited(actions=[*RANK["actions"], GHOST]), "actions.3.id", "POST /v1/arms"),
        (
            _edited(actions=[GHOST | {"id": "a b"}], excludedActions=[]),
            "actions.0.id",
            "POST /v1/arms",
        ),
        (
            _edited(actions=[*RANK["actions"], RANK["actions"][0]]),
            "actions.3.id",
            "repeats actions.0.id",
        ),
        (_edited(excludedActions=["Ghost"]), "excludedActions.0", "not the id of one of"),
        (_edited(excludedActions=list(ARMS)), "excludedActions", "every action is excluded"),
        (_edited(contextFeatures=DEEP), "contextFeatures.0.user.address", "do not nest"),
        (
            _edited(contextFeatures=[{"user": {"tags": ["a", 1]}}]),
            "contextFeatures.0.user.tags.1",
            "only strings or only numbers",
        ),
        (
            _edited(contextFeatures=[{"a": 1}, {"user": {"age": 31}}, {"user": {"age": 32}}]),
            "contextFeatures.2.user.age",
            "another value (first in contextFeatures.1)",
        ),
        (
            _edited(contextFeatures=[{"user": "x"}, {"user": {"age": 1}}]),
            "contextFeatures.1.user",
            "a namespace in one object and a feature in another (contextFeatures.0)",
        ),
        (
            _edited(contextFeatures=[{"a": True}, {"a": 1}]),
            "contextFeatures.1.a",
            "another value",
        ),
        (  # found once hashed, by /v1's own check, and named in the request's terms
            _edited(contextFeatures=[{"a": 1}, {"user": {"age": 2e6}}]),
            "contextFeatures.1.user.age",
            "ROFU_MAX_ABS_FEATURE",
        ),
        (  # validated even though a model with an output per arm ignores them
            _edited(actions=[{"id": "NewsArticle", "features": DEEP}], excludedActions=[]),
            "actions.0.features.0.user.address",
            "do not nest",
        ),
    ],
)
async def test_personalizer_rank_refuses_bad_input_naming_the_field(
    service: Service, body: dict[str, Any], target: str, words: str
) -> None:
    client, app = service
    response = await client.post(f"{PREFIX}/rank", json=body)
    error = assert_error(response, 400, target)
    assert words in error["message"]
    assert _count(app, "decisions") == 0


@pytest.mark.anyio
async def test_personalizer_rank_refuses_a_retired_arm(service: Service) -> None:
    client, app = service
    assert (await client.delete("/v1/arms/NewsArticle")).status_code == 200
    response = await client.post(f"{PREFIX}/rank", json=RANK)
    error = assert_error(response, 400, "actions.0.id")
    assert "'NewsArticle' is retired" in error["message"]
    assert "POST /v1/arms" in error["message"]
    excluded = await client.post(f"{PREFIX}/rank", json=_edited(excludedActions=["NewsArticle"]))
    assert excluded.status_code == 201, excluded.text  # excluded: it need not be an arm
    assert _count(app, "decisions") == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "body", "status", "target", "words"),
    [
        ("events/id/reward", {"value": 1}, 404, "eventId", "no decision with eventId 'id'"),
        ("events/id/activate", None, 404, "eventId", "no decision with eventId 'id'"),
        ("events/a%20b/reward", {"value": 1}, 400, "eventId", "a GUID fits"),
        ("events/a%20b/activate", None, 400, "eventId", "a GUID fits"),
        (f"events/{EVENT_ID}/reward", {"value": "1"}, 400, "value", "valid number"),
        (f"events/{EVENT_ID}/reward", {"value": 2e6}, 400, "value", "ROFU_MAX_ABS_REWARD"),
        (f"events/{EVENT_ID}/reward", {}, 400, "value", "Field required"),
        (f"events/{EVENT_ID}/reward", {"value": 1, "x": 2}, 400, "x", "Extra inputs"),
        (f"events/{EVENT_ID}/reward", None, 400, "body", "content-type application/json"),
        ("configurations/service", None, 404, None, "no configuration, evaluation"),
        ("ranks", RANK, 404, None, "is not served"),
    ],
)
async def test_personalizer_event_errors_have_personalizers_shape(
    service: Service, path: str, body: Any, status: int, target: str | None, words: str
) -> None:
    client, app = service
    assert (await client.post(f"{PREFIX}/rank", json=RANK)).status_code == 201
    response = await client.post(f"{PREFIX}/{path}", json=body)
    error = assert_error(response, status, target)
    assert words in error["message"]
    assert (_count(app, "rewards"), _count(app, "decisions")) == (0, 1)


@pytest.mark.anyio
async def test_personalizer_reward_not_sent_as_json_is_a_415(service: Service) -> None:
    client, app = service
    assert (await client.post(f"{PREFIX}/rank", json=RANK)).status_code == 201
    response = await client.post(
        f"{PREFIX}/events/{EVENT_ID}/reward", content=b"1", headers={"content-type": "text/plain"}
    )
    error = assert_error(response, 415, "content-type")
    assert "must be application/json (got 'text/plain')" in error["message"]
    assert _count(app, "rewards") == 0


@pytest.mark.anyio
async def test_personalizer_transport_errors_have_personalizers_shape(
    settings: Settings,
) -> None:
    async with app_client(settings.model_copy(update={"max_body_bytes": 256})) as (client, app):
        large = await client.post(
            f"{PREFIX}/rank", json=_edited(contextFeatures=[{"x": "y" * 300}])
        )
        untyped = await client.post(f"{PREFIX}/rank", content=b'{"actions": []}')
        text_body = await client.post(
            f"{PREFIX}/rank", content=b'{"actions": []}', headers={"content-type": "text/plain"}
        )
        form = await client.post(f"{PREFIX}/rank", data={"eventId": EVENT_ID})
        broken = await client.post(
            f"{PREFIX}/rank", content=b'{"actions": [', headers={"content-type": "application/json"}
        )
        method = await client.get(f"{PREFIX}/rank")
        v1 = await client.post("/v1/select", json={"context": {}, "stray": 1})
        assert _count(app, "decisions") == 0
    assert "exceeds 256 bytes" in assert_error(large, 413, None)["message"]
    for refused, got in (
        (untyped, "none"),
        (text_body, "'text/plain'"),
        (form, "'application/x-www-form-urlencoded'"),
    ):
        error = assert_error(refused, 415, "content-type")
        assert error["message"] == f"body: the content-type must be application/json (got {got})"
        assert error["innerError"] == {"code": "unsupported_media_type"}
    assert "not valid JSON" in assert_error(broken, 400, "body")["message"]
    assert_error(method, 405, None)
    assert method.headers["allow"] == "POST"
    assert v1.json()["error"]["field"] == "stray"  # /v1 keeps rofu's own shape
    assert v1.status_code == 422


@pytest.mark.anyio
async def test_personalizer_outage_is_a_503_with_retry_after(
    settings: Settings, tmp_path: Path
) -> None:
    locked = settings.model_copy(update={"sqlite_busy_timeout_ms": 100})
    async with app_client(locked) as (client, _):
        holder = sqlite3.connect(tmp_path / "rofu.sqlite", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's lock
        try:
            ranked = await client.post(f"{PREFIX}/rank", json=RANK)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        again = await client.post(f"{PREFIX}/rank", json=RANK)
    error = assert_error(ranked, 503, None)
    assert error["innerError"] == {"code": "unavailable"}
    assert ranked.headers["retry-after"].isdigit()
    assert again.status_code == 201, again.text  # a retry with the same eventId succeeds


# The translation alone -----------------------------------------------------------------


def test_personalizer_merge_joins_namespaces_key_by_key() -> None:
    merged = merge(
        [{"user": {"age": 31}, "hour": 9}, {"user": {"country": "fr"}}, {"hour": 9.0}],
        "contextFeatures",
    )
    assert merged.named == {"user": {"age": 31.0, "country": "fr"}, "hour": 9.0}
    assert merged.origins == {
        ("user",): 0,
        ("user", "age"): 0,
        ("hour",): 0,
        ("user", "country"): 1,
    }
    assert merged.located("user.country") == ".1.user.country"
    assert merged.located("user.age.0") == ".0.user.age.0"
    assert merged.located("") == ""
    assert merge([], "contextFeatures").named == {}


def test_personalizer_fields_name_rofus_fields_in_the_requests_terms(settings: Settings) -> None:
    body = RankRequest.model_validate(
        _edited(contextFeatures=[{"a": 1}, {"user.x": {"age": 2}}], excludedActions=["NewsArticle"])
    )
    fields = translate(body, settings).fields
    assert fields.target("arms.0") == "actions.1.id"  # NewsArticle is excluded
    assert fields.target("arms") == "actions"
    assert fields.target("context.user.x.age") == "contextFeatures.1.user.x.age"
    assert fields.target("context") == "contextFeatures"
    assert fields.target("event_id") == "eventId"
    assert fields.target("defer") == "deferActivation"
    error = fields.translated(InvalidInput("arms.1: unknown arm 'Ghost'", field="arms.1"))
    assert (error.field, type(error)) == ("actions.2.id", InvalidInput)
    assert error.message.startswith("actions.2.id: unknown arm 'Ghost' (actions must be")
    assert isinstance(fields, Fields)


def test_personalizer_ranking_puts_the_chosen_first_then_by_probability() -> None:
    body = RankRequest.model_validate(
        {
            "actions": [{"id": a, "features": []} for a in ("a", "b", "c", "d")],
            "excludedActions": ["c"],
        }
    )
    probabilities = [("a", 0.25), ("b", 0.25), ("d", 0.5)]
    decision = SelectResponse(
        event_id="e",
        arm="b",
        model_version=1,
        propensity=0.25,
        explore=True,
        policy="rofu",
        scores=[],
        probabilities=[ArmProbability(arm=a, probability=p) for a, p in probabilities],
    )
    ranked = ranking(body, decision).model_dump(by_alias=True)
    assert ranked == {
        "ranking": [
            {"id": "b", "probability": 0.25},
            {"id": "d", "probability": 0.5},
            {"id": "a", "probability": 0.25},
            {"id": "c", "probability": 0.0},
        ],
        "eventId": "e",
        "rewardActionId": "b",
    }
    legacy = decision.model_copy(update={"probabilities": None})
    with pytest.raises(Conflict, match="before rofu stored"):
        ranking(body, legacy)


def test_personalizer_error_codes_are_those_the_schema_declares() -> None:
    assert {error_code(status) for status in (400, 401, 404, 405, 409, 413, 415, 422)} | {
        error_code(503)
    } == set(get_args(ErrorCode))
