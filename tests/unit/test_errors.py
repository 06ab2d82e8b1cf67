"""The error hierarchy mapped to HTTP once: bodies, statuses and headers, in-process."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from rofu.service.errors import (
    BatcherClosed,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    Unavailable,
)
from rofu.service.settings import Settings
from tests.personalizer import PREFIX, RANK, with_arms
from tests.support import app_client, seed_checkpoint

SHUTTING_DOWN = {"code": "unavailable", "message": "the service is shutting down", "field": None}


def _body(response: httpx.Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    body: dict[str, object] = response.json()
    return body


def test_errors_carry_their_headers() -> None:
    assert ServiceError("boom").headers() is None
    assert Unauthorized("no key").headers() == {"WWW-Authenticate": "Bearer"}
    assert Unavailable("database down").headers() == {"Retry-After": "2"}
    assert Unavailable("database down", retry_after=7).headers() == {"Retry-After": "7"}


def test_errors_batcher_closed_is_an_unavailable_service_error() -> None:
    error = BatcherClosed()
    assert isinstance(error, Unavailable)
    response = error.response()
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    assert json.loads(response.body) == {"error": SHUTTING_DOWN}


def test_errors_overloaded_is_an_unavailable_error_of_its_own_code() -> None:
    error = Overloaded(256)
    assert isinstance(error, Unavailable)
    assert error.cause is None  # not a database failure: never counted or logged as one
    response = error.response()
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    body = json.loads(response.body)["error"]
    assert (body["code"], body["field"]) == ("overloaded", None)
    assert "256 requests already wait" in body["message"]


@pytest.mark.anyio
async def test_service_select_after_shutdown_is_a_503_with_retry_after(
    sqlite_settings: Settings,
) -> None:
    async with app_client(sqlite_settings) as (client, app):
        await app.state.runtime.batcher.aclose()
        response = await client.post("/v1/select", json={"context": [0.0, 0.0, 0.0, 0.0]})
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    assert _body(response) == {"error": SHUTTING_DOWN}


@pytest.mark.anyio
async def test_service_body_over_the_limit_is_the_payload_too_large_error(
    sqlite_settings: Settings,
) -> None:
    settings = sqlite_settings.model_copy(update={"max_body_bytes": 256})
    want = PayloadTooLarge("request body exceeds 256 bytes").response()

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(3):
            yield b"x" * 100

    async with app_client(settings) as (client, _):
        declared = await client.post("/v1/select", content=b"x" * 300)
        streamed = await client.post("/v1/reward", content=chunks())
    for response in (declared, streamed):
        assert response.status_code == 413
        assert _body(response) == json.loads(want.body)
        assert response.json()["error"]["code"] == "payload_too_large"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/select", b'{"arms": ["arm-0"]}', "context"),  # the schema's checks
        ("POST", "/v1/select", b'{"context": [0.1, 0.2, 0.3, 0.4], "stray": 1}', "stray"),
        ("POST", "/v1/select", b'{"context": "warm"}', "context"),
        ("POST", "/v1/select", b'{"context": [', "body"),  # not JSON
        ("POST", "/v1/select", b"", "body"),  # no body
        ("POST", "/v1/select", b'{"context": [0.1]}', "context"),  # the service's own checks
        ("POST", "/v1/reward", b'{"event_id": "e", "value": 1e9}', "value"),
        ("GET", "/v1/model/checkpoints?limit=0", b"", "query.limit"),
        ("DELETE", "/v1/arms/arm%209", b"", "path.arm_id"),
    ],
)
async def test_errors_every_422_has_the_one_code(
    sqlite_settings: Settings, method: str, path: str, body: bytes, field: str
) -> None:
    async with app_client(sqlite_settings) as (client, _):
        headers = {"content-type": "application/json"} if body else {}
        response = await client.request(method, path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_input", field)


SEEDED = "seeded"  # a decision made before the refused posts, so that a reward could join it
JSON_POSTS: list[tuple[str, str, dict[str, object]]] = [
    ("POST", "/v1/select", {"context": [0.1, 0.2, 0.3, 0.4], "event_id": "posted"}),
    ("POST", "/v1/reward", {"event_id": SEEDED, "value": 1.0}),
    ("POST", "/v1/arms", {"id": "arm-new"}),
    ("PUT", "/v1/admin/pin", {"version": 1}),
    ("PUT", "/v1/admin/checkpoints/1", {"status": "promoted"}),
    ("POST", f"{PREFIX}/rank", {**RANK, "eventId": "ranked"}),
    ("POST", f"{PREFIX}/events/{SEEDED}/reward", {"value": 1.0}),
]


def _state(app: FastAPI) -> tuple[int, ...]:
    """Decisions, rewards, arms and pinned versions stored."""
    queries = [f"select count(*) from {table}" for table in ("decisions", "rewards", "arms")]
    queries.append("select count(*) from model_pin where version is not null")
    with app.state.runtime.engine.connect() as connection:
        return tuple(int(connection.execute(text(q)).scalar_one()) for q in queries)


@pytest.mark.anyio
async def test_errors_a_body_not_sent_as_json_is_a_415_on_every_json_endpoint(
    sqlite_settings: Settings,
) -> None:
    settings = with_arms(sqlite_settings)
    seed_checkpoint(settings, n_rows=20, version=1)
    async with app_client(settings) as (client, app):
        seeded = {"context": [0.1, 0.2, 0.3, 0.4], "event_id": SEEDED}
        assert (await client.post("/v1/select", json=seeded)).status_code == 200
        before = _state(app)
        for method, path, payload in JSON_POSTS:
            as_text = await client.request(
                method, path, content=json.dumps(payload), headers={"content-type": "text/plain"}
            )
            form = {key: str(value) for key, value in payload.items()}
            as_form = await client.request(method, path, data=form)
            for refused, got in ((as_text, "text/plain"), (as_form, "form-urlencoded")):
                assert refused.status_code == 415, (path, refused.text)
                message = refused.json()["error"]["message"]
                assert "the content-type must be application/json" in message, path
                assert got in message, path
        assert _state(app) == before  # nothing changed
        schema = (await client.get("/openapi.json")).json()["paths"]
        for method, path, payload in JSON_POSTS:  # the same bodies as JSON are taken
            accepted = await client.request(method, path, json=payload)
            assert accepted.status_code < 300, (path, accepted.text)
            if path.startswith("/v1"):
                (template,) = (
                    t for t in schema if re.fullmatch(re.sub(r"{\w+}", "[^/]+", t), path)
                )
                assert "415" in schema[template][method.lower()]["responses"], path
