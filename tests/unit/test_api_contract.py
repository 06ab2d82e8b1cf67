"""The API's contract: every API path under /v1 (or the Personalizer-compatible facade's
/personalizer/v1.0), declared key schemes, and the interactive docs served entirely by
the app (no CDN)."""

from __future__ import annotations

import re

import pytest

from tests.support import app_client

API_PATHS = {
    "/v1/select",
    "/v1/select/validate",
    "/v1/reward",
    "/v1/events/{event_id}/activate",
    "/v1/arms",
    "/v1/arms/{arm_id}",
    "/v1/model",
    "/v1/model/checkpoints",
    "/v1/admin/pin",
    "/v1/admin/checkpoints/{version}",
    "/v1/decisions",
    "/v1/report",
}
PERSONALIZER_PATHS = {
    "/personalizer/v1.0/rank",
    "/personalizer/v1.0/events/{eventId}/reward",
    "/personalizer/v1.0/events/{eventId}/activate",
}


@pytest.mark.anyio
async def test_every_api_path_is_versioned_and_declares_the_bearer_scheme(sqlite_settings):
    async with app_client(sqlite_settings) as (client, _):
        schema = (await client.get("/openapi.json")).json()
        unversioned = await client.post("/select", json={"context": [0.1, 0.2, 0.3, 0.4]})
    assert set(schema["paths"]) == API_PATHS | PERSONALIZER_PATHS | {
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A client or admin API key: `Authorization: Bearer <key>`",
    }
    for path in API_PATHS:
        for operation in schema["paths"][path].values():
            assert operation["security"] == [{"apiKey": []}], path
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in schema["paths"][path]["get"]
    assert unversioned.status_code == 404


@pytest.mark.anyio
async def test_personalizer_paths_declare_personalizers_key_header_and_error_shape(
    sqlite_settings,
):
    async with app_client(sqlite_settings) as (client, _):
        schema = (await client.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["subscriptionKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "Ocp-Apim-Subscription-Key",
        "description": "A client or admin API key in Personalizer's header (the "
        "Personalizer-compatible routes only): `Ocp-Apim-Subscription-Key: <key>`",
    }
    for path in PERSONALIZER_PATHS:
        (operation,) = schema["paths"][path].values()  # POST only
        assert operation["security"] == [{"apiKey": []}, {"subscriptionKey": []}], path
        success = "201" if path.endswith("/rank") else "204"
        assert set(operation["responses"]) == {success, "default"}, path
        error = operation["responses"]["default"]["content"]["application/json"]["schema"]
        assert error == {"$ref": "#/components/schemas/PersonalizerErrorResponse"}
    error = schema["components"]["schemas"]["PersonalizerError"]
    assert error["properties"]["code"]["enum"] == [
        "BadRequest",
        "401",
        "ResourceNotFound",
        "InvalidRankRequest",
        "PayloadSizeExceeded",
        "InternalServerError",
    ]
    rank = schema["components"]["schemas"]["RankRequest"]
    assert set(rank["properties"]) == {
        "contextFeatures",
        "actions",
        "excludedActions",
        "eventId",
        "deferActivation",
    }
    assert (rank["required"], rank["additionalProperties"]) == (["actions"], False)
    response = schema["components"]["schemas"]["RankResponse"]
    assert set(response["properties"]) == {"ranking", "eventId", "rewardActionId"}


@pytest.mark.anyio
@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_render_from_the_apps_own_assets(sqlite_settings, page):
    async with app_client(sqlite_settings) as (client, _):
        html = (await client.get(page)).text
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
        urls += re.findall(r"url:\s*'([^']+)'", html) + re.findall(r'spec-url="([^"]+)"', html)
        assert urls, html
        assert not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        for url in urls:
            fetched = await client.get(url)
            assert fetched.status_code == 200, url
            assert len(fetched.content) > 100, url
