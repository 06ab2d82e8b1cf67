"""`AsyncRofuClient`: the asyncio client, the same calls as `RofuClient`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import httpx
from pydantic import TypeAdapter

from rofu.client._calls import (
    ACTIVATED,
    ARMS,
    CHECKPOINTS,
    MODEL,
    RECORDS,
    REPORT,
    REWARDED,
    SELECTED,
    Call,
    Context,
    Moment,
    Retry,
    T,
    activate_call,
    auth_headers,
    checkpoints_call,
    export_call,
    next_page,
    parse,
    report_call,
    reward_call,
    select_call,
)
from rofu.client.experiment import ReportResponse
from rofu.client.records import DecisionRecord
from rofu.client.schemas import (
    ActivateResponse,
    ArmResponse,
    CheckpointInfo,
    ModelResponse,
    RewardResponse,
    SelectResponse,
)


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
        self._retry = Retry(retries, max_backoff_s)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=auth_headers(api_key),
            timeout=timeout_s,
            transport=transport,
            limits=limits or httpx.Limits(),
        )

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
        explain: bool = False,
        unit_id: str | None = None,
    ) -> SelectResponse:
        """POST /v1/select (see `RofuClient.select`)."""
        call = select_call(
            context,
            event_id,
            arms,
            exclude,
            explore,
            defer,
            arm_features,
            baseline_arm,
            explain,
            unit_id,
        )
        return parse(SELECTED, await self.send(call))

    async def reward(
        self, event_id: str, value: float, *, metrics: Mapping[str, float] | None = None
    ) -> RewardResponse:
        """POST /v1/reward (see `RofuClient.reward`)."""
        return parse(REWARDED, await self.send(reward_call(event_id, value, metrics)))

    async def report(self, since: Moment = None) -> ReportResponse:
        """GET /v1/report (admin key; see `RofuClient.report`)."""
        return parse(REPORT, await self.send(report_call(since)))

    async def activate(self, event_id: str) -> ActivateResponse:
        """POST /v1/events/{event_id}/activate."""
        return parse(ACTIVATED, await self.send(activate_call(event_id)))

    async def arms(self) -> list[ArmResponse]:
        """GET /v1/arms."""
        return parse(ARMS, await self.send(Call("GET", "/v1/arms")))

    async def model(self) -> ModelResponse:
        """GET /v1/model."""
        return parse(MODEL, await self.send(Call("GET", "/v1/model")))

    def checkpoints(self, page_size: int = 50) -> AsyncIterator[CheckpointInfo]:
        """Every stored checkpoint, newest first, page by page."""
        return self._pages(checkpoints_call(page_size), CHECKPOINTS)

    def export(
        self, since: Moment = None, until: Moment = None, *, page_size: int = 1000
    ) -> AsyncIterator[DecisionRecord]:
        """GET /v1/decisions (admin key), page by page."""
        return self._pages(export_call(since, until, page_size), RECORDS)

    async def _pages(self, first: Call, adapter: TypeAdapter[list[T]]) -> AsyncIterator[T]:
        """The items of `first`'s page and of every page its `Link` headers lead to."""
        call: Call | None = first
        while call is not None:
            response = await self.send(call)
            for item in parse(adapter, response):
                yield item
            call = next_page(response)
