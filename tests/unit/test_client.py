"""The rofu client: typed calls, retries that honour Retry-After and reuse the event id,
errors with the server's code, checkpoint and decision-log pages followed through `Link`,
and deferred activation."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from rofu.client import (
    ActivateResponse,
    AsyncRofuClient,
    DecisionRecord,
    RofuClient,
    RofuError,
    SelectResponse,
    _async,
    _sync,
)
from tests.support import app_client, seed_checkpoint

DECISION = {
    "event_id": "",
    "arm": "a",
    "model_version": 0,
    "propensity": 0.5,
    "explore": True,
    "policy": "cold-start",
    "scores": [{"arm": "a", "mean": None, "bonus": None, "ucb": None}],
}


class Script:
    """A mock transport answering from a list: a status (with headers) or an exception."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        status, headers = step
        if status == 200:
            body = {**DECISION, "event_id": json.loads(request.content)["event_id"]}
            return httpx.Response(200, json=body)
        error = {"error": {"code": "unavailable", "message": "busy", "field": None}}
        if status == 422:
            error = {"error": {"code": "invalid_input", "message": "bad", "field": "context"}}
        return httpx.Response(status, json=error, headers=headers)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(_sync.time, "sleep", slept.append)
    return slept


def test_a_503_is_retried_after_retry_after_with_the_same_event_id(waits):
    script = Script((503, {"Retry-After": "2"}), httpx.ConnectError("refused"), (200, {}))
    with RofuClient("http://rofu", transport=httpx.MockTransport(script)) as rofu:
        decision = rofu.select([0.1, 0.2])
    assert isinstance(decision, SelectResponse)
    ids = {json.loads(r.content)["event_id"] for r in script.requests}
    assert len(script.requests) == 3
    assert ids == {decision.event_id}
    # the server's Retry-After, then the backoff (0.1 * 2**1), each stretched by 1 to 1.5
    assert waits == [_stretched(2.0), _stretched(0.2)]


def test_retries_are_bounded_and_refusals_are_not_retried(waits):
    script = Script(*[(503, {"Retry-After": "600"})] * 3)
    rofu = RofuClient("http://rofu", transport=httpx.MockTransport(script), retries=2)
    with rofu, pytest.raises(RofuError) as failed:
        rofu.select([0.1])
    assert (failed.value.status, failed.value.code) == (503, "unavailable")
    assert waits == [10.0, 10.0]  # Retry-After capped at max_backoff_s
    bad = Script((422, {}))
    rofu = RofuClient("http://rofu", transport=httpx.MockTransport(bad))
    with rofu, pytest.raises(RofuError) as refused:
        rofu.select([0.1])
    assert (refused.value.status, refused.value.field, len(bad.requests)) == (422, "context", 1)
    down = Script(*[httpx.ConnectError("refused")] * 2)
    rofu = RofuClient("http://rofu", transport=httpx.MockTransport(down), retries=1)
    with rofu, pytest.raises(RofuError, match="unreachable"):
        rofu.reward("e", 1.0)
    with pytest.raises(ValueError, match="retries"):
        RofuClient("http://rofu", retries=-1)


@pytest.mark.anyio
async def test_async_client_retries_the_same_way(monkeypatch):
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(_async.asyncio, "sleep", sleep)
    script = Script((503, {"Retry-After": "1"}), (200, {}))
    async with AsyncRofuClient("http://rofu", transport=httpx.MockTransport(script)) as rofu:
        decision = await rofu.select([0.3], event_id="mine")
    assert decision.event_id == "mine"
    assert [json.loads(r.content)["event_id"] for r in script.requests] == ["mine", "mine"]
    assert slept == [_stretched(1.0)]


def test_select_sends_named_features_and_arm_features_as_given(waits):
    script = Script((200, {}))
    with RofuClient("http://rofu", transport=httpx.MockTransport(script)) as rofu:
        rofu.select(
            {"user": {"age": 31, "tags": ["a"]}},
            arm_features={"arm-1": {"item": {"price": 9.5}}, "arm-2": (1.0, 2.0)},
        )
    body = json.loads(script.requests[0].content)
    assert body["context"] == {"user": {"age": 31, "tags": ["a"]}}
    assert body["arm_features"] == {"arm-1": {"item": {"price": 9.5}}, "arm-2": [1.0, 2.0]}


@pytest.mark.anyio
async def test_client_round_trip_against_the_app(sqlite_settings):
    for version in range(1, 4):
        seed_checkpoint(sqlite_settings, n_rows=20, version=version)
    async with app_client(sqlite_settings) as (http, app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncRofuClient(str(http.base_url), transport=transport) as rofu:
            decision = await rofu.select([0.1, 0.2, 0.3, 0.4], arms=["arm-1", "arm-2"])
            assert decision.arm in {"arm-1", "arm-2"}
            assert [score.arm for score in decision.scores] == ["arm-1", "arm-2"]
            again = await rofu.select(
                [0.1, 0.2, 0.3, 0.4], event_id=decision.event_id, arms=["arm-1", "arm-2"]
            )
            assert again == decision
            recorded = await rofu.select([0.1, 0.2, 0.3, 0.4], baseline_arm="arm-3")
            assert recorded.baseline_arm == "arm-3"  # online mode: recorded, not served
            named = await rofu.select({"user": {"age": 31, "country": "fr"}}, event_id="named")
            assert named.model_version == 3
            assert await rofu.select({"user": {"country": "fr", "age": 31}}, event_id="named") == (
                named
            )
            assert not (await rofu.reward(decision.event_id, 1.0)).duplicate
            assert (await rofu.reward(decision.event_id, 1.0)).duplicate
            assert [arm.id for arm in await rofu.arms()][:2] == ["arm-0", "arm-1"]
            assert (await rofu.model()).version == 3
            versions = [info.version async for info in rofu.checkpoints(page_size=2)]
            assert versions == [3, 2, 1]
            deferred = await rofu.select([0.4, 0.3, 0.2, 0.1], defer=True)
            assert deferred.deferred
            assert (await rofu.activate(deferred.event_id)).status == "activated"
            assert (await rofu.activate(deferred.event_id)).status == "already_active"
            logged = [record async for record in rofu.export(page_size=1)]
            assert [r.event_id for r in logged] == [
                decision.event_id,
                recorded.event_id,
                "named",
                deferred.event_id,
            ]
            assert [r.deferred for r in logged] == [False, False, False, True]
            assert [r.reward for r in logged] == [1.0, None, None, None]
            assert logged[1].baseline_arm == "arm-3"
            assert logged[2].named_context == {"user": {"age": 31.0, "country": "fr"}}
            with pytest.raises(RofuError) as refused:
                await rofu.select([0.1])
            assert (refused.value.status, refused.value.field) == (422, "context")


def _record(event_id: str, *, active: bool = True) -> dict[str, Any]:
    """A row of GET /v1/decisions as the service writes it."""
    return {
        "event_id": event_id,
        "created_at": "2026-12-01T12:00:00Z",
        "context": [0.1, 0.2],
        "candidates": ["a", "b"],
        "arm": "a",
        "slot": 0,
        "propensity": 0.5,
        "probabilities": [0.5, 0.5],
        "model_version": 1,
        "policy": "rofu",
        "explore": True,
        "scores": [{"arm": arm, "mean": 0.1, "bonus": 0.2, "ucb": 0.3} for arm in "ab"],
        "reward": 1.0 if active else None,
        "reward_received_at": None,
        "late": None,
        "deferred": not active,
        "activated_at": None,
        "activation_late": False,
        "active": active,
    }


class Log:
    """A mock decision log: two pages joined by a Link header (one 503 on the second),
    and the activate endpoint."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.busy = True

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/activate"):
            event_id = request.url.path.split("/")[-2]
            body = {"event_id": event_id, "status": "activated", "deferred": True}
            return httpx.Response(200, json={**body, "activated_at": None, "duplicate": False})
        if "cursor" not in request.url.params:
            link = '</v1/decisions?limit=2&cursor=abc>; rel="next"'
            page = [_record("e-1"), _record("e-2", active=False)]
            return httpx.Response(200, json=page, headers={"Link": link})
        if self.busy:
            self.busy = False
            error = {"error": {"code": "unavailable", "message": "busy", "field": None}}
            return httpx.Response(503, json=error, headers={"Retry-After": "1"})
        return httpx.Response(200, json=[_record("e-3")])


def test_export_follows_the_pages_as_typed_rows_and_retries_a_page(waits):
    log = Log()
    with RofuClient("http://rofu", transport=httpx.MockTransport(log)) as rofu:
        rows = rofu.export(since=datetime(2026, 12, 1, tzinfo=UTC), until="2026-12-02", page_size=2)
        assert not log.requests  # lazy: nothing is fetched before iteration
        records = list(rows)
    assert all(isinstance(record, DecisionRecord) for record in records)
    assert [(r.event_id, r.active) for r in records] == [
        ("e-1", True),
        ("e-2", False),
        ("e-3", True),
    ]
    first = log.requests[0].url.params
    assert dict(first) == {
        "limit": "2",
        "since": "2026-12-01T00:00:00+00:00",
        "until": "2026-12-02",
    }
    assert [r.url.params.get("cursor") for r in log.requests] == [None, "abc", "abc"]
    assert waits == [_stretched(1.0)]


def test_activate_posts_to_the_event_and_select_sends_defer(waits):
    log = Log()
    with RofuClient("http://rofu", transport=httpx.MockTransport(log)) as rofu:
        answer = rofu.activate("order-7")
    assert isinstance(answer, ActivateResponse)
    assert (answer.event_id, answer.status) == ("order-7", "activated")
    (request,) = log.requests
    assert (request.method, request.url.path) == ("POST", "/v1/events/order-7/activate")
    script = Script((200, {}))
    with RofuClient("http://rofu", transport=httpx.MockTransport(script)) as rofu:
        rofu.select([0.1], defer=True)
    assert json.loads(script.requests[0].content)["defer"] is True


@pytest.mark.anyio
async def test_async_client_exports_and_activates(monkeypatch):
    async def sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr(_async.asyncio, "sleep", sleep)
    log = Log()
    async with AsyncRofuClient("http://rofu", transport=httpx.MockTransport(log)) as rofu:
        events = [record.event_id async for record in rofu.export(page_size=2)]
        answer = await rofu.activate("e-2")
    assert events == ["e-1", "e-2", "e-3"]
    assert answer.event_id == "e-2"


def test_retry_waits_at_least_what_the_server_asked_and_spreads_clients():
    import random

    import httpx

    from rofu.client._calls import Retry

    refused = httpx.Response(503, headers={"Retry-After": "1"})
    waits = [Retry(3, 10.0, random.Random(seed)).delay(0, refused) for seed in range(20)]
    assert all(1.0 <= wait < 1.5 for wait in waits)
    assert len({round(wait, 6) for wait in waits}) > 10  # not one instant for everyone
    assert Retry(3, 1.2, random.Random(0)).delay(0, refused) <= 1.2  # the cap still holds


class _stretched:
    """Equal to a wait of `asked` stretched by the client's jitter: in [asked, 1.5 asked)."""

    def __init__(self, asked: float) -> None:
        self.asked = asked

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and self.asked <= other < 1.5 * self.asked

    def __repr__(self) -> str:
        return f"[{self.asked:g}, {1.5 * self.asked:g})"


@pytest.mark.anyio
async def test_client_sends_unit_ids_and_metrics_and_reads_the_report(sqlite_settings):
    settings = sqlite_settings.model_copy(update={"holdout_share": 0.5})
    seed_checkpoint(settings, n_rows=20)
    async with app_client(settings) as (http, app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncRofuClient(str(http.base_url), transport=transport) as rofu:
            groups = set()
            for i in range(12):
                decision = await rofu.select([0.1, 0.2, 0.3, 0.4], unit_id=f"user-{i}")
                assert decision.experiment in {"rofu", "holdout"}
                groups.add(decision.experiment)
                await rofu.reward(decision.event_id, 1.0, metrics={"latency_ms": 10.0 * i})
            report = await rofu.report()
            assert await rofu.report(since=datetime(2999, 1, 1, tzinfo=UTC)) != report
    assert groups == {"rofu", "holdout"}
    assert sum(group.units for group in report.groups.values()) == 12
    assert set(report.guardrails) == {"latency_ms"}
