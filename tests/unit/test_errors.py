"""The error hierarchy mapped to HTTP once: bodies, statuses and headers, in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from rofu.service.errors import (
    BatcherClosed,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    Unavailable,
)
from rofu.service.settings import Settings
from tests.support import app_client

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
