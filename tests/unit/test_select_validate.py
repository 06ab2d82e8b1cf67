"""POST /v1/select/validate: a /select request checked exactly as /select checks it, the
vectors the model would read returned, and nothing decided or stored."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text

from rofu.service.deciding.features import to_vector
from rofu.service.settings import Settings
from tests.support import app_client

KEY = "client-key-aaaaaaaaaaaaaaaa"
NAMED = {"user": {"age": 31, "country": "fr"}, "device": {"mobile": True}}


def _decisions(app: FastAPI) -> int:
    with app.state.runtime.engine.connect() as connection:
        return int(connection.execute(text("select count(*) from decisions")).scalar_one())


@pytest.mark.anyio
async def test_validate_returns_the_vectors_the_model_reads_and_stores_nothing(sqlite_settings):
    async with app_client(sqlite_settings) as (client, app):
        dense = await client.post("/v1/select/validate", json={"context": [0.5, -1, 2, 0]})
        named = await client.post("/v1/select/validate", json={"context": NAMED})
        stored = _decisions(app)
    assert dense.status_code == 200, dense.text
    assert dense.json() == {"valid": True, "context": [0.5, -1.0, 2.0, 0.0], "arm_features": {}}
    want = to_vector(
        NAMED,
        sqlite_settings.context_dim,
        sqlite_settings.feature_hash_seed,
        max_abs=sqlite_settings.max_abs_feature,
    )
    assert named.json()["context"] == pytest.approx(list(want))
    assert stored == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    "body",
    [
        {"context": [0.1, 0.2, 0.3]},  # one short
        {"context": [0.1, 0.2, 0.3, 1e300]},  # beyond ROFU_MAX_ABS_FEATURE
        {"context": [0.1, 0.2, 0.3, 0.4], "arm_features": {"arm-0": [1.0]}},  # no arm features
        {"context": [0.1, 0.2, 0.3, 0.4], "surprise": 1},  # an unknown field
    ],
    ids=["length", "bound", "arm features", "unknown field"],
)
async def test_validate_refuses_what_select_refuses_with_the_same_error(sqlite_settings, body):
    async with app_client(sqlite_settings) as (client, app):
        checked = await client.post("/v1/select/validate", json=body)
        selected = await client.post("/v1/select", json=body)
        stored = _decisions(app)
    assert checked.status_code == selected.status_code == 422
    assert checked.json() == selected.json()
    assert stored == 0


@pytest.mark.anyio
async def test_validate_needs_a_client_key_as_select_does(sqlite_settings: Settings):
    keyed = sqlite_settings.model_copy(
        update={"api_keys": [SecretStr(KEY)], "admin_api_keys": [SecretStr("admin-" + KEY)]}
    )
    body = {"context": [0.1, 0.2, 0.3, 0.4]}
    async with app_client(keyed) as (client, _):
        anonymous = await client.post("/v1/select/validate", json=body)
        keyed_call = await client.post(
            "/v1/select/validate", json=body, headers={"Authorization": f"Bearer {KEY}"}
        )
    assert anonymous.status_code == 401
    assert keyed_call.status_code == 200
