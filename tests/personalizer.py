"""Azure Personalizer v1.0's REST reference examples, and checks shared by the facade's
tests (`tests/unit/test_personalizer*.py`, `tests/e2e/test_personalizer_e2e.py`).

The bodies are the reference's (`Azure/azure-rest-api-specs`, `specification/
cognitiveservices/data-plane/Personalizer/stable/v1.0/examples`: Rank.json,
Events_Reward.json, Events_Activate.json, and the multi-slot example's context).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from rofu.service.settings import ArmSpec, Settings

PREFIX = "/personalizer/v1.0"
ARMS = ("NewsArticle", "SportsArticle", "EntertainmentArticle")
EVENT_ID = "75269AD0-BFEE-4598-8196-C57383D38E10"

# Rank.json: the request, and the response the reference shows for it.
RANK: dict[str, Any] = {
    "contextFeatures": [{"timeOfDay": "Morning"}],
    "actions": [
        {"id": "NewsArticle", "features": [{"type": "News"}]},
        {"id": "SportsArticle", "features": [{"type": "Sports"}]},
        {"id": "EntertainmentArticle", "features": [{"type": "Entertainment"}]},
    ],
    "excludedActions": ["SportsArticle"],
    "eventId": EVENT_ID,
    "deferActivation": False,
}
RANK_RESPONSE: dict[str, Any] = {
    "ranking": [
        {"id": "EntertainmentArticle", "probability": 0.8},
        {"id": "SportsArticle", "probability": 0},
        {"id": "NewsArticle", "probability": 0.2},
    ],
    "eventId": EVENT_ID,
    "rewardActionId": "EntertainmentArticle",
}
# Events_Reward.json and Events_Activate.json: the path's eventId and the body.
EXAMPLE_EVENT = "id"
REWARD: dict[str, Any] = {"value": 1}
# The multi-slot example's context: namespaces of strings, booleans and a number.
MULTI_SLOT_CONTEXT: list[dict[str, Any]] = [
    {"user": {"profileType": "AnonymousUser", "latLong": "47.6,-122.1"}},
    {"environment": {"dayOfMonth": "28", "monthOfYear": "8", "weather": "Sunny"}},
    {"device": {"mobile": True, "windows": True}},
    {"recentActivity": {"itemsInCart": 3}},
]
MULTI_SLOT_MERGED = {
    "user": {"profileType": "AnonymousUser", "latLong": "47.6,-122.1"},
    "environment": {"dayOfMonth": "28", "monthOfYear": "8", "weather": "Sunny"},
    "device": {"mobile": True, "windows": True},
    "recentActivity": {"itemsInCart": 3.0},
}


def with_arms(settings: Settings) -> Settings:
    """`settings` with the reference's three articles as the catalogue."""
    return settings.model_copy(update={"arms": [ArmSpec(id=arm) for arm in ARMS]})


def assert_like_the_reference(body: dict[str, Any], request: dict[str, Any]) -> None:
    """`body` has exactly the keys and shapes of the reference's Rank response, ranks every
    action of `request` once (excluded ones at 0, the rest summing to 1), the chosen first."""
    assert set(body) == set(RANK_RESPONSE)
    assert all(set(item) == {"id", "probability"} for item in body["ranking"])
    ids = [action["id"] for action in request["actions"]]
    ranked = {item["id"]: item["probability"] for item in body["ranking"]}
    assert sorted(ranked) == sorted(ids)
    assert len(body["ranking"]) == len(ids)
    assert all(isinstance(p, float | int) and 0 <= p <= 1 for p in ranked.values())
    excluded = set(request.get("excludedActions") or ())
    assert all(ranked[arm] == 0 for arm in excluded)
    assert math.isclose(sum(ranked[arm] for arm in ids if arm not in excluded), 1.0)
    assert body["rewardActionId"] == body["ranking"][0]["id"]
    assert body["rewardActionId"] not in excluded
    assert ranked[body["rewardActionId"]] > 0
    rest = [item["probability"] for item in body["ranking"][1:]]
    assert rest == sorted(rest, reverse=True)
    if request.get("eventId"):
        assert body["eventId"] == request["eventId"]


# Personalizer's error code for each status the facade answers with: its own codes, and
# "401", which Azure's gateway answered for a missing or wrong key.
CODES = {
    400: "BadRequest",
    401: "401",
    404: "ResourceNotFound",
    405: "BadRequest",
    409: "InvalidRankRequest",
    413: "PayloadSizeExceeded",
    415: "BadRequest",
    503: "InternalServerError",
}


def assert_error(response: httpx.Response, status: int, target: str | None) -> dict[str, Any]:
    """A Personalizer ErrorResponse with `status`, naming `target` (in its message too)."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert (
        {"code", "message", "innerError"}
        <= set(error)
        <= {
            "code",
            "message",
            "target",
            "innerError",
        }
    )
    assert error["code"] == CODES[status], error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert set(error["innerError"]) == {"code"}
    assert error.get("target") == target
    if target is not None:
        assert target in error["message"]
    return error
