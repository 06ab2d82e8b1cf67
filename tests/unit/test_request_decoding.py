"""Invalid Unicode anywhere in a request (a JSON body's keys and values, the query, the
path, the key headers) is a 4xx naming where, and changes nothing: never a 500."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import SecretStr
from sqlalchemy import text

import rofu.service.api.routes
from rofu.service.api.decoding import JsonRoute, decode_json
from rofu.service.errors import InvalidInput
from rofu.service.settings import Settings
from tests.personalizer import PREFIX, RANK, assert_error, with_arms
from tests.support import app_client

JSON = {"content-type": "application/json"}
Service = tuple[httpx.AsyncClient, FastAPI]


@pytest.fixture
async def service(sqlite_settings: Settings) -> AsyncIterator[Service]:
    async with app_client(with_arms(sqlite_settings)) as pair:
        yield pair


def _counts(app: FastAPI) -> tuple[int, ...]:
    with app.state.runtime.engine.connect() as connection:
        return tuple(
            connection.execute(text(f"select count(*) from {table}")).scalar_one()
            for table in ("decisions", "rewards", "arms")
        )


def _invalid(body: bytes) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        decode_json(body)
    return caught.value


@pytest.mark.parametrize(
    ("body", "value"),
    [
        (b'{"a": "caf\\u00e9", "b": ["\\ud83d\\ude00"]}', {"a": "café", "b": ["\U0001f600"]}),
        ('{"é": "ü"}'.encode(), {"é": "ü"}),
        (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),  # a byte order mark is ignored (RFC 8259)
        (b'{"a": "\\\\ud800"}', {"a": "\\ud800"}),  # an escaped backslash, not an escape
    ],
)
def test_decode_json_reads_valid_unicode(body: bytes, value: Any) -> None:
    assert decode_json(body) == value


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'{"context": {"\\ud800": 1}}', "context.\\ud800", "the key holds a lone surrogate"),
        (b'{"a": {"b": "x\\udfff"}}', "a.b", "the string holds a lone surrogate (\\udfff)"),
        (b'{"a": [1, "ok", "\\ud800\\ud800"]}', "a.2", "lone surrogate (\\ud800)"),
        (b'{"a": "\\udc00\\ud800"}', "a", "lone surrogate (\\udc00)"),  # a pair the wrong way
        (b'"\\ud800"', "body", "lone surrogate"),
        (b'{"caf\xe9": 1}', "caf\\xe9", "the key holds a byte that is not UTF-8 (\\xe9)"),
        (b'{"a": [{"b": "\xff\xfe"}]}', "a.0.b", "a byte that is not UTF-8 (\\xff)"),
        (b'{"a": "\xed\xa0\x80"}', "a", "not UTF-8 (\\xed)"),  # a surrogate encoded as UTF-8
        (b"\xe9t\xe9", "body", "not valid UTF-8 at byte 0"),
        (b'{"a": 1}\xff', "body", "not valid UTF-8 at byte 8"),
        (b'\xff\xfe{\x00"\x00a\x00"\x00:\x001\x00}\x00', "body", "not valid UTF-8"),  # UTF-16
        (b"[" * 100_000 + b"]" * 100_000, "body", "nested too deeply"),
        (b"[" + b"1" * 5000 + b"]", "body", "4300 digits"),
    ],
)
def test_decode_json_refuses_invalid_unicode_naming_the_place(
    body: bytes, field: str, words: str
) -> None:
    error = _invalid(body)
    assert error.field == field
    assert error.message.startswith(f"{field}: ")
    assert words in error.message
    error.response()  # renders: nothing unencodable is echoed


def test_decode_json_leaves_json_syntax_errors_to_the_framework() -> None:
    with pytest.raises(json.JSONDecodeError):
        decode_json(b'{"a": ')


def test_every_router_decodes_strictly() -> None:
    """A new router without the route class would read lone surrogates again."""
    package = rofu.service.api.routes
    for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        router = importlib.import_module(module.name).router
        routes = [route for route in router.routes if isinstance(route, APIRoute)]
        assert routes, module.name
        assert all(isinstance(route, JsonRoute) for route in routes), module.name


def _json_operations(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every operation of the schema that takes a JSON body."""
    return [
        (method, path.replace("{eventId}", "some-event").replace("{version}", "1"))
        for path, operations in app.openapi()["paths"].items()
        for method, operation in operations.items()
        if "application/json" in operation.get("requestBody", {}).get("content", {})
    ]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"\\ud800": 1}', "\\ud800"),
        (b'{"x": "\\udc00"}', "x"),
        (b'{"caf\xe9": 1}', "caf\\xe9"),
        (b'{"x": "\xe9t\xe9"}', "x"),
    ],
)
async def test_every_json_endpoint_refuses_invalid_unicode(
    service: Service, body: bytes, field: str
) -> None:
    client, app = service
    before = _counts(app)
    operations = _json_operations(app)
    # select, select/validate, reward, arms, pin, a checkpoint's gate status, rank, facade reward
    assert len(operations) == 8, operations
    for method, path in operations:
        response = await client.request(method, path, content=body, headers=JSON)
        if path.startswith(PREFIX):  # Personalizer's shape: a 422 is a 400
            assert_error(response, 400, field)
        else:
            assert response.status_code == 422, (path, response.text)
            assert response.json()["error"]["field"] == field, path
        assert "not valid Unicode" in response.text or "not UTF-8" in response.text
    assert _counts(app) == before


@pytest.mark.anyio
async def test_select_refuses_a_lone_surrogate_named_feature(service: Service) -> None:
    client, app = service
    for named in ('{"\\ud800": 1}', '{"user": {"\\udbff": "fr"}}', '{"user": {"c": "\\ud800"}}'):
        body = f'{{"context": {named}}}'.encode()
        response = await client.post("/v1/select", content=body, headers=JSON)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_input"
        assert error["field"].startswith("context.")
        assert "lone surrogate" in error["message"]
    assert _counts(app)[0] == 0  # no decision logged


@pytest.mark.anyio
async def test_rank_refuses_a_lone_surrogate_feature(service: Service) -> None:
    client, app = service
    rank = json.dumps(RANK)
    for place, escaped in [
        ('"timeOfDay"', '"\\ud800"'),  # a context feature's name
        ('"Morning"', '"Morning\\udc00"'),  # its value
        ('"News"', '"\\ud800"'),  # an action's feature
    ]:
        body = rank.replace(place, escaped, 1).encode()
        response = await client.post(f"{PREFIX}/rank", content=body, headers=JSON)
        target = response.json()["error"].get("target", "")
        assert target.startswith(("contextFeatures.0.", "actions.0.features.0.")), target
        error = assert_error(response, 400, target)
        assert error["innerError"]["code"] == "invalid_input"
    assert _counts(app)[0] == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("GET", "/v1/decisions?cursor=%ff", "query.cursor"),
        ("GET", "/v1/decisions?limit=2&since=%ED%A0%80", "query.since"),
        ("GET", "/v1/model/checkpoints?%ff=1", "query.\\xff"),
        ("POST", "/v1/events/%ff/activate", "path"),
        ("DELETE", "/v1/arms/%ED%A0%80", "path"),
        ("POST", f"{PREFIX}/events/%ff/activate", "path"),
    ],
)
async def test_urls_that_are_not_utf8_are_refused_naming_the_part(
    service: Service, method: str, url: str, field: str
) -> None:
    client, app = service
    before = _counts(app)
    response = await client.request(method, url)
    if url.startswith(PREFIX):
        assert_error(response, 400, field)
    else:
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == field
    assert "not valid UTF-8 once percent-decoded" in response.text
    assert _counts(app) == before


@pytest.mark.anyio
async def test_key_headers_that_are_not_utf8_are_a_401(sqlite_settings: Settings) -> None:
    keyed = with_arms(sqlite_settings).model_copy(update={"api_keys": [SecretStr("k" * 20)]})
    async with app_client(keyed) as (client, app):
        for path, header, value in [
            ("/v1/select", "Authorization", b"Bearer \xff\xfe"),
            ("/v1/select", "X-API-Key", b"\xed\xa0\x80"),
            (f"{PREFIX}/rank", "Ocp-Apim-Subscription-Key", b"\xe9t\xe9"),
        ]:
            response = await client.post(path, json=RANK, headers={header: value})
            assert response.status_code == 401, response.text
            assert "the API key is not valid" in response.text
        assert _counts(app)[0] == 0
