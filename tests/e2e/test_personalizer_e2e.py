"""The Personalizer-compatible facade against a real `rofu serve`, as a Personalizer
client calls it: the reference's Rank.json, Events_Reward.json and Events_Activate.json
over HTTP with Personalizer's `Ocp-Apim-Subscription-Key` header, and what the service
stored, read back through /v1."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.personalizer import (
    ARMS,
    EVENT_ID,
    EXAMPLE_EVENT,
    MULTI_SLOT_CONTEXT,
    PREFIX,
    RANK,
    REWARD,
    assert_error,
    assert_like_the_reference,
)
from tests.support import service_process

CLIENT_KEY = "personalizer-client-key-0123456789"
ADMIN_KEY = "personalizer-admin-key-0123456789"


def test_personalizer_examples_against_rofu_serve(tmp_path: Path) -> None:
    env = {
        "ROFU_DATABASE_URL": f"sqlite:///{tmp_path}/rofu.sqlite",
        "ROFU_CONTEXT_DIM": "16",
        "ROFU_HIDDEN": "[16]",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_REWARD_WINDOW_SECONDS": "60",
        "ROFU_ARMS": json.dumps([{"id": arm} for arm in ARMS]),
        "ROFU_API_KEYS": json.dumps([CLIENT_KEY]),
        "ROFU_ADMIN_API_KEYS": json.dumps([ADMIN_KEY]),
    }
    with service_process(env, tmp_path / "service.log") as base_url:
        key = {"Ocp-Apim-Subscription-Key": CLIENT_KEY}
        with httpx.Client(base_url=f"{base_url}{PREFIX}", headers=key, timeout=30) as client:
            ranked = client.post("/rank", json=RANK)
            assert ranked.status_code == 201, ranked.text
            assert_like_the_reference(ranked.json(), RANK)
            assert client.post("/rank", json=RANK).json() == ranked.json()  # idempotent
            deferred = {**RANK, "eventId": EXAMPLE_EVENT, "deferActivation": True}
            deferred["contextFeatures"] = MULTI_SLOT_CONTEXT
            assert client.post("/rank", json=deferred).status_code == 201
            rewarded = client.post(f"/events/{EXAMPLE_EVENT}/reward", json=REWARD)
            activated = client.post(f"/events/{EXAMPLE_EVENT}/activate")
            assert (rewarded.status_code, rewarded.content) == (204, b"")
            assert (activated.status_code, activated.content) == (204, b"")
            unknown = client.post("/events/unknown-event/reward", json=REWARD)
            assert_error(unknown, 404, "eventId")
            wrong = client.post("/rank", json=RANK, headers={"Ocp-Apim-Subscription-Key": "x"})
            assert_error(wrong, 401, None)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        log = httpx.get(f"{base_url}/v1/decisions", headers=admin, timeout=30)
        assert log.status_code == 200, log.text
    decisions = {row["event_id"]: row for row in log.json()}
    assert set(decisions) == {EVENT_ID, EXAMPLE_EVENT}
    assert decisions[EVENT_ID]["arm"] == ranked.json()["rewardActionId"]
    assert decisions[EXAMPLE_EVENT]["reward"] == 1.0
    assert decisions[EXAMPLE_EVENT]["active"] is True
    assert "Traceback" not in (tmp_path / "service.log").read_text(errors="replace")
