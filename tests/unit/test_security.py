"""API keys: roles, key files, production rules, and that keys are never echoed."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr
from sqlalchemy import text

from rofu.service.api.app import create_app
from rofu.service.api.security import KeyRing, read_key_file
from rofu.service.settings import Settings
from tests.support import app_client

CLIENT = "client-key-aaaaaaaaaaaaaaaa"
ADMIN = "admin-key-bbbbbbbbbbbbbbbbbb"
BODY = {"context": [0.1, 0.2, 0.3, 0.4]}


@pytest.fixture
def keyed(sqlite_settings: Settings) -> Settings:
    keys = {"api_keys": [SecretStr(CLIENT)], "admin_api_keys": [SecretStr(ADMIN)]}
    return sqlite_settings.model_copy(update=keys)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keyring_roles_and_constant_time_lookup(keyed):
    ring = KeyRing.from_settings(keyed)
    assert (ring.role(CLIENT), ring.role(ADMIN), ring.role("nope"), ring.open) == (
        "client",
        "admin",
        None,
        False,
    )
    assert KeyRing.from_settings(
        keyed.model_copy(update={"api_keys": [], "admin_api_keys": []})
    ).open


def test_keyring_reads_key_files(tmp_path, sqlite_settings):
    path = tmp_path / "keys"
    path.write_text("# rotated 2026-11\nfirst-key-1234567890\n\n  second-key-1234567890  \n")
    assert read_key_file(path) == ["first-key-1234567890", "second-key-1234567890"]
    ring = KeyRing.from_settings(sqlite_settings.model_copy(update={"api_keys_file": path}))
    assert ring.role("second-key-1234567890") == "client"
    with pytest.raises(ValueError, match="cannot read API key file"):
        read_key_file(tmp_path / "missing")


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({}, "needs client and admin API keys"),
        ({"api_keys": [CLIENT]}, "needs client and admin API keys"),
        ({"api_keys": ["short"], "admin_api_keys": [ADMIN]}, "at least 16 characters"),
    ],
)
def test_keyring_production_rules(update, message):
    settings = Settings(
        mode="production",
        database_url="postgresql://x@localhost/db",
        redis_url="redis://localhost:6379/0",
        **update,
    )
    with pytest.raises(ValueError, match=message):
        KeyRing.from_settings(settings)
    with pytest.raises(ValueError, match=message):
        create_app(settings)  # the API refuses to start


def test_keyring_warns_when_the_service_runs_open(sqlite_settings, caplog):
    with caplog.at_level(logging.WARNING, logger="rofu.security"):
        KeyRing.from_settings(sqlite_settings)
    assert "no API keys configured" in caplog.text


@pytest.mark.anyio
async def test_api_requires_a_client_key_and_writes_nothing_without_one(keyed):
    async with app_client(keyed) as (client, app):
        missing = await client.post("/v1/select", json=BODY)
        wrong = await client.post("/v1/select", json=BODY, headers=_bearer("wrong-key-123456789"))
        assert (missing.status_code, wrong.status_code) == (401, 401)
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "unauthorized"
        with app.state.runtime.engine.connect() as connection:
            assert connection.execute(text("select count(*) from decisions")).scalar_one() == 0
        ok = await client.post("/v1/select", json=BODY, headers=_bearer(CLIENT))
        by_header = await client.post("/v1/select", json=BODY, headers={"X-API-Key": ADMIN})
        assert (ok.status_code, by_header.status_code) == (200, 200)
        reward = {"event_id": ok.json()["event_id"], "value": 1.0}
        assert (await client.post("/v1/reward", json=reward)).status_code == 401
        assert (
            await client.post("/v1/reward", json=reward, headers=_bearer(CLIENT))
        ).status_code == 200


@pytest.mark.anyio
async def test_api_admin_endpoints_need_an_admin_key(keyed):
    async with app_client(keyed) as (client, _):
        arm = {"id": "new-arm"}
        assert (await client.post("/v1/arms", json=arm, headers=_bearer(CLIENT))).status_code == 403
        assert (await client.get("/v1/admin/pin", headers=_bearer(CLIENT))).status_code == 403
        assert (await client.get("/v1/arms", headers=_bearer(CLIENT))).status_code == 200
        assert (await client.get("/v1/model", headers=_bearer(CLIENT))).status_code == 200
        assert (await client.get("/v1/model")).status_code == 401
        assert (await client.post("/v1/arms", json=arm, headers=_bearer(ADMIN))).status_code == 201
        assert (await client.delete("/v1/arms/new-arm", headers=_bearer(ADMIN))).status_code == 200
        assert (await client.get("/v1/admin/pin", headers=_bearer(ADMIN))).status_code == 200


@pytest.mark.anyio
async def test_api_probes_and_metrics_stay_open(keyed):
    async with app_client(keyed) as (client, _):
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200, path


@pytest.mark.anyio
async def test_api_never_echoes_or_logs_a_key(keyed, caplog):
    secret = "presented-secret-key-99999"
    with caplog.at_level(logging.DEBUG):
        async with app_client(keyed) as (client, _):
            bad = await client.post("/v1/select", json=BODY, headers=_bearer(secret))
            good = await client.post("/v1/select", json=BODY, headers=_bearer(CLIENT))
    assert bad.status_code == 401
    assert secret not in bad.text
    assert CLIENT not in good.text
    for key in (secret, CLIENT, ADMIN):
        assert key not in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("docs", ["key", "off"])
async def test_docs_need_a_key_or_are_off(keyed, docs):
    async with app_client(keyed.model_copy(update={"docs": docs})) as (client, _):
        for path in ("/docs", "/redoc"):  # not served: a 404, for a caller with a key
            assert (await client.get(path)).status_code == 401
            assert (await client.get(path, headers=_bearer(CLIENT))).status_code == 404
        anonymous = await client.get("/openapi.json")
        keyed_call = await client.get("/openapi.json", headers=_bearer(CLIENT))
        if docs == "off":
            assert (anonymous.status_code, keyed_call.status_code) == (401, 404)
        else:
            assert anonymous.status_code == 401
            assert keyed_call.status_code == 200
            assert "/v1/select" in keyed_call.json()["paths"]
        assert (
            await client.post("/v1/select", json=BODY, headers=_bearer(CLIENT))
        ).status_code == 200


@pytest.mark.anyio
async def test_docs_are_open_in_the_embedded_default(keyed):
    async with app_client(keyed) as (client, _):
        assert (await client.get("/openapi.json")).status_code == 200
        assert (await client.get("/docs")).status_code == 200


def test_production_serves_the_schema_only_with_a_key(keyed):
    production = keyed.model_copy(
        update={"mode": "production", "database_url": "postgresql://h/db", "redis_url": "redis://h"}
    )
    assert production.docs_access == "key"
    assert production.model_copy(update={"docs": "off"}).docs_access == "off"
    assert keyed.docs_access == "open"
    paths = {getattr(route, "path", "") for route in create_app(production).routes}
    assert "/openapi.json" in paths
    assert not {"/docs", "/redoc"} & paths


LIMIT = 512  # ROFU_MAX_BODY_BYTES of the ordering tests
PREFIX = "/personalizer/v1.0"
SUBSCRIPTION = "Ocp-Apim-Subscription-Key"
JSON = {"content-type": "application/json"}
MALFORMED = [b'{"context": [0.1,', b'{"context": {"\\ud800": 1}}', b"\xe9t\xe9", b'{"stray": 1}']


def _count(app, table: str) -> int:
    with app.state.runtime.engine.connect() as connection:
        return connection.execute(text(f"select count(*) from {table}")).scalar_one()


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/v1/select", "/v1/reward", "/v1/arms", f"{PREFIX}/rank"])
async def test_api_refuses_an_anonymous_malformed_body_with_401(keyed, path):
    """Without a key the answer is a 401 whatever the body: it does not teach the schema."""
    async with app_client(keyed) as (client, app):
        for body in MALFORMED:
            for headers in ({}, _bearer("wrong-key-123456789"), {SUBSCRIPTION: "nope"}):
                response = await client.post(path, content=body, headers=JSON | headers)
                assert response.status_code == 401, (body, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
        keyed_call = await client.post(path, content=MALFORMED[0], headers=JSON | _bearer(ADMIN))
        assert keyed_call.status_code == (400 if path.startswith(PREFIX) else 422)
        assert _count(app, "decisions") == 0


@pytest.mark.anyio
async def test_api_refuses_an_anonymous_oversized_body_with_401_before_reading_it(keyed):
    read: list[bytes] = []

    async def streamed():  # no Content-Length: the body limit would have to read it
        for _ in range(4):
            read.append(b"x")
            yield b"x" * LIMIT

    settings = keyed.model_copy(update={"max_body_bytes": LIMIT})
    async with app_client(settings) as (client, _):
        for path in ("/v1/select", f"{PREFIX}/rank"):
            declared = await client.post(path, content=b"x" * (LIMIT + 1), headers=JSON)
            chunked = await client.post(path, content=streamed(), headers=JSON)
            assert (declared.status_code, chunked.status_code) == (401, 401), path
            assert not read  # refused before a byte of the body was read
            keyed_call = await client.post(
                path, content=b"x" * (LIMIT + 1), headers=JSON | {"X-API-Key": CLIENT}
            )
            keyed_stream = await client.post(path, content=streamed(), headers=_bearer(CLIENT))
            assert (keyed_call.status_code, keyed_stream.status_code) == (413, 413), path
            read.clear()


@pytest.mark.anyio
async def test_api_401s_keep_each_error_shape(keyed):
    async with app_client(keyed) as (client, _):
        v1 = await client.post("/v1/select", content=b"{", headers=JSON)
        facade = await client.post(f"{PREFIX}/rank", content=b"{", headers=JSON)
        unknown = await client.get("/v1/nothing-here")
        known_to_a_key = await client.get("/v1/nothing-here", headers=_bearer(CLIENT))
    assert v1.json() == {
        "error": {
            "code": "unauthorized",
            "message": "an API key is required: send `Authorization: Bearer <key>`",
            "field": None,
        }
    }
    error = facade.json()["error"]
    assert error["innerError"] == {"code": "unauthorized"}
    assert SUBSCRIPTION in error["message"]
    # an anonymous caller does not learn which paths exist
    assert (unknown.status_code, known_to_a_key.status_code) == (401, 404)


@pytest.mark.anyio
async def test_api_checks_roles_after_authentication(keyed):
    """The order changed, not the roles: a client key on an admin call is still a 403."""
    async with app_client(keyed) as (client, _):
        anonymous = await client.put("/v1/admin/pin", content=b"{", headers=JSON)
        client_key = await client.put("/v1/admin/pin", json={"version": 1}, headers=_bearer(CLIENT))
        admin_key = await client.put("/v1/admin/pin", content=b"{", headers=JSON | _bearer(ADMIN))
    assert (anonymous.status_code, client_key.status_code, admin_key.status_code) == (
        401,
        403,
        422,
    )


@pytest.mark.anyio
async def test_api_open_paths_need_no_key_with_any_body(keyed):
    async with app_client(keyed) as (client, _):
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/docs-assets/swagger-ui.css")).status_code == 200
        assert (await client.post("/healthz", content=b"\xff")).status_code == 405


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/v1/select", f"{PREFIX}/rank"])
async def test_api_answers_the_first_fault_in_order(keyed, path):
    """401, then 413, then 415, then the body's own error: each fault removed in turn."""
    settings = keyed.model_copy(update={"max_body_bytes": LIMIT})
    bad = b'{"context": {"\\ud800": 1}, "x": "\xe9"}'
    text_plain = {"content-type": "text/plain"}
    async with app_client(settings) as (client, app):
        steps = [
            (bad + b" " * LIMIT, text_plain),
            (bad + b" " * LIMIT, text_plain | _bearer(CLIENT)),
            (bad, text_plain | _bearer(CLIENT)),
            (bad, JSON | _bearer(CLIENT)),
        ]
        statuses = [
            (await client.post(path, content=body, headers=headers)).status_code
            for body, headers in steps
        ]
        assert _count(app, "decisions") == 0
    assert statuses == [401, 413, 415, 400 if path.startswith(PREFIX) else 422]
