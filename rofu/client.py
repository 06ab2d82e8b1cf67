"""The rofu client: `RofuClient` (blocking) and `AsyncRofuClient` (asyncio), over httpx.

    from rofu.client import RofuClient

    with RofuClient("http://127.0.0.1:8000", api_key="...") as rofu:
        decision = rofu.select([0.1, 0.5, -0.2, 0.0, 1.0, 0.3, 0.0, 0.7])
        rofu.reward(decision.event_id, 1.0)
        shown = rofu.select([0.3, 0.1, 0.0, 0.2, 0.5, 0.0, 0.1, 0.9], defer=True)
        rofu.activate(shown.event_id)  # trained on only once the app showed it
        for record in rofu.export(since="2026-12-01"):  # the decision log (admin key)
            print(record.event_id, record.arm, record.reward, record.active)

Requests and responses are the server's own schemas (`rofu.service.api.schemas`). A request that
gets a 503 or cannot connect is retried after the server's `Retry-After` (or an
exponential backoff), at most `retries` times and never waiting longer than
`max_backoff_s` at once. `select` draws its `event_id` before the first attempt, so a
retry repeats the same request and the service returns the one decision it stored.
Errors are `RofuError` with the server's code, message and field. `checkpoints` and
`export` follow the server's `Link` headers page by page, holding one page at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from rofu.service.api.schemas import (
    ActivateResponse,
    ArmResponse,
    CheckpointInfo,
    ModelResponse,
    RewardResponse,
    SelectResponse,
)
from rofu.service.log.record import DecisionRecord

T = TypeVar("T")
RETRY_STATUSES = frozenset({503})


class RofuError(Exception):
    """A request the service refused, or that failed after every retry."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    @classmethod
    def from_response(cls, response: httpx.Response) -> RofuError:
        """The error the service's `{"error": {...}}` body describes."""
        try:
            error = response.json()["error"]
            return cls(response.status_code, error["code"], error["message"], error.get("field"))
        except (ValueError, KeyError, TypeError):
            return cls(response.status_code, "http_error", response.text[:200] or "no body")


@dataclass(frozen=True)
class Call:
    """One API call: what to send and how to read the answer."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


Context = Sequence[float] | Mapping[str, Any]  # a vector, or named features (README)


def _select(
    context: Context,
    event_id: str | None,
    arms: Sequence[str] | None,
    exclude: Sequence[str] | None,
    explore: bool,
    defer: bool = False,
    arm_features: Mapping[str, Context] | None = None,
    baseline_arm: str | None = None,
) -> Call:
    body: dict[str, Any] = {
        "context": dict(context) if isinstance(context, Mapping) else list(context),
        "event_id": event_id or uuid.uuid4().hex,  # drawn once: every retry repeats it
        "explore": explore,
        "defer": defer,
    }
    if arms is not None:
        body["arms"] = list(arms)
    if exclude is not None:
        body["exclude"] = list(exclude)
    if arm_features is not None:
        body["arm_features"] = {
            arm: dict(z) if isinstance(z, Mapping) else list(z) for arm, z in arm_features.items()
        }
    if baseline_arm is not None:
        body["baseline_arm"] = baseline_arm
    return Call("POST", "/v1/select", body)


def _activate(event_id: str) -> Call:
    return Call("POST", f"/v1/events/{quote(event_id, safe='')}/activate")


Moment = datetime | str | None  # an ISO 8601 date or time; without an offset, UTC


def _export(since: Moment, until: Moment, page_size: int) -> Call:
    params: dict[str, Any] = {"limit": page_size}
    for name, moment in (("since", since), ("until", until)):
        if moment is not None:
            params[name] = moment.isoformat() if isinstance(moment, datetime) else moment
    return Call("GET", "/v1/decisions", params=params)


def _parse(adapter: TypeAdapter[T], response: httpx.Response) -> T:
    if response.status_code >= 400:
        raise RofuError.from_response(response)
    return adapter.validate_json(response.content)


def _next_page(response: httpx.Response) -> str | None:
    """The `rel="next"` target of a `Link` header, if any."""
    link = response.links.get("next")
    return None if link is None else str(link["url"])


class _Retry:
    """When to try again: a 503 or a failed connection, honouring Retry-After."""

    def __init__(self, retries: int, max_backoff_s: float) -> None:
        if retries < 0 or max_backoff_s < 0:
            raise ValueError("retries and max_backoff_s must be >= 0")
        self.retries = retries
        self.max_backoff_s = max_backoff_s

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before attempt `attempt + 1`."""
        wait = min(0.1 * 2**attempt, self.max_backoff_s)
        if response is not None:
            with contextlib.suppress(ValueError):  # an HTTP date: keep the backoff
                wait = float(response.headers.get("retry-after", wait))
        return float(max(0.0, min(wait, self.max_backoff_s)))

    def wanted(self, attempt: int, response: httpx.Response | None) -> bool:
        """Whether to retry after this outcome (None: the connection failed)."""
        if attempt >= self.retries:
            return False
        return response is None or response.status_code in RETRY_STATUSES

    def wait(
        self, attempt: int, response: httpx.Response | None, error: httpx.TransportError | None
    ) -> float | None:
        """Seconds to wait before trying again, or None: `response` is the answer. A failed
        connection that is not retried is a RofuError."""
        if self.wanted(attempt, response):
            return self.delay(attempt, response)
        if error is not None:
            raise RofuError(0, "unreachable", str(error) or type(error).__name__) from error
        return None


def _headers(api_key: str | None) -> dict[str, str]:
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}


SELECTED = TypeAdapter(SelectResponse)
REWARDED = TypeAdapter(RewardResponse)
ARM = TypeAdapter(ArmResponse)
ARMS = TypeAdapter(list[ArmResponse])
MODEL = TypeAdapter(ModelResponse)
CHECKPOINTS = TypeAdapter(list[CheckpointInfo])
ACTIVATED = TypeAdapter(ActivateResponse)
RECORDS = TypeAdapter(list[DecisionRecord])


class RofuClient:
    """A blocking client of one rofu service."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        max_backoff_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout_s, transport=transport
        )
        self._retry = _Retry(retries, max_backoff_s)

    def __enter__(self) -> RofuClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def send(self, call: Call) -> httpx.Response:
        """Send `call`, retrying as the class docstring says; the last response."""
        attempt = 0
        while True:
            response, error = None, None
            try:
                response = self._http.request(
                    call.method, call.path, json=call.body, params=call.params
                )
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry.wait(attempt, response, error)
            if wait is None and response is not None:
                return response
            time.sleep(wait or 0.0)
            attempt += 1

    def select(
        self,
        context: Context,
        *,
        event_id: str | None = None,
        arms: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        explore: bool = True,
        defer: bool = False,
        arm_features: Mapping[str, Context] | None = None,
        baseline_arm: str | None = None,
    ) -> SelectResponse:
        """POST /v1/select: a decision (the same one again for a repeated `event_id`).

        `context` is a vector of context_dim numbers or an object of named features;
        `arm_features` gives candidates per-request features (arm-feature models); with
        `defer`, the decision is trained on only once `activate` activates it;
        `baseline_arm` is the app's own choice (served in apprentice mode)."""
        call = _select(context, event_id, arms, exclude, explore, defer, arm_features, baseline_arm)
        return _parse(SELECTED, self.send(call))

    def reward(self, event_id: str, value: float) -> RewardResponse:
        """POST /v1/reward: the reward of a decision (a repeat is `duplicate`)."""
        call = Call("POST", "/v1/reward", {"event_id": event_id, "value": value})
        return _parse(REWARDED, self.send(call))

    def activate(self, event_id: str) -> ActivateResponse:
        """POST /v1/events/{event_id}/activate: a deferred decision may be trained on
        (idempotent; `status` says `late` when it came too late to count)."""
        return _parse(ACTIVATED, self.send(_activate(event_id)))

    def arms(self) -> list[ArmResponse]:
        """GET /v1/arms: every arm, active and retired."""
        return _parse(ARMS, self.send(Call("GET", "/v1/arms")))

    def add_arm(self, arm_id: str, features: Sequence[float] | None = None) -> ArmResponse:
        """POST /v1/arms (admin key)."""
        body = {"id": arm_id, "features": None if features is None else list(features)}
        return _parse(ARM, self.send(Call("POST", "/v1/arms", body)))

    def retire_arm(self, arm_id: str) -> ArmResponse:
        """DELETE /v1/arms/{id} (admin key)."""
        return _parse(ARM, self.send(Call("DELETE", f"/v1/arms/{arm_id}")))

    def model(self) -> ModelResponse:
        """GET /v1/model: the served checkpoint and its settings."""
        return _parse(MODEL, self.send(Call("GET", "/v1/model")))

    def checkpoints(self, page_size: int = 50) -> Iterator[CheckpointInfo]:
        """Every stored checkpoint, newest first, following the pages' `Link` headers."""
        call = Call("GET", "/v1/model/checkpoints", params={"limit": page_size})
        return self._pages(call, CHECKPOINTS)

    def export(
        self, since: Moment = None, until: Moment = None, *, page_size: int = 1000
    ) -> Iterator[DecisionRecord]:
        """GET /v1/decisions (admin key): every logged decision in `[since, until)`, oldest
        first, with its reward and activation (`active` is false for a deferred decision
        not activated in time), one page at a time."""
        return self._pages(_export(since, until, page_size), RECORDS)

    def _pages(self, first: Call, adapter: TypeAdapter[list[T]]) -> Iterator[T]:
        """The items of `first`'s page and of every page its `Link` headers lead to."""
        call: Call | None = first
        while call is not None:
            response = self.send(call)
            yield from _parse(adapter, response)
            target = _next_page(response)
            call = None if target is None else Call("GET", target)


class AsyncRofuClient:
    """The asyncio client: the same calls as `RofuClient`, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=_headers(api_key),
            timeout=timeout_s,
            transport=transport,
            limits=limits or httpx.Limits(),
        )
        self._retry = _Retry(retries, max_backoff_s)

    async def __aenter__(self) -> AsyncRofuClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def send(self, call: Call) -> httpx.Response:
        """Send `call`, retrying as `RofuClient.send` does."""
        attempt = 0
        while True:
            response, error = None, None
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.body, params=call.params
                )
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry.wait(attempt, response, error)
            if wait is None and response is not None:
                return response
            await asyncio.sleep(wait or 0.0)
            attempt += 1

    async def select(
        self,
        context: Context,
        *,
        event_id: str | None = None,
        arms: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        explore: bool = True,
        defer: bool = False,
        arm_features: Mapping[str, Context] | None = None,
        baseline_arm: str | None = None,
    ) -> SelectResponse:
        """POST /v1/select (see `RofuClient.select`)."""
        call = _select(context, event_id, arms, exclude, explore, defer, arm_features, baseline_arm)
        return _parse(SELECTED, await self.send(call))

    async def reward(self, event_id: str, value: float) -> RewardResponse:
        """POST /v1/reward."""
        call = Call("POST", "/v1/reward", {"event_id": event_id, "value": value})
        return _parse(REWARDED, await self.send(call))

    async def activate(self, event_id: str) -> ActivateResponse:
        """POST /v1/events/{event_id}/activate."""
        return _parse(ACTIVATED, await self.send(_activate(event_id)))

    async def arms(self) -> list[ArmResponse]:
        """GET /v1/arms."""
        return _parse(ARMS, await self.send(Call("GET", "/v1/arms")))

    async def model(self) -> ModelResponse:
        """GET /v1/model."""
        return _parse(MODEL, await self.send(Call("GET", "/v1/model")))

    def checkpoints(self, page_size: int = 50) -> AsyncIterator[CheckpointInfo]:
        """Every stored checkpoint, newest first, page by page."""
        call = Call("GET", "/v1/model/checkpoints", params={"limit": page_size})
        return self._pages(call, CHECKPOINTS)

    def export(
        self, since: Moment = None, until: Moment = None, *, page_size: int = 1000
    ) -> AsyncIterator[DecisionRecord]:
        """GET /v1/decisions (admin key), page by page."""
        return self._pages(_export(since, until, page_size), RECORDS)

    async def _pages(self, first: Call, adapter: TypeAdapter[list[T]]) -> AsyncIterator[T]:
        """The items of `first`'s page and of every page its `Link` headers lead to."""
        call: Call | None = first
        while call is not None:
            response = await self.send(call)
            for item in _parse(adapter, response):
                yield item
            target = _next_page(response)
            call = None if target is None else Call("GET", target)
