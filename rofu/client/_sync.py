"""`RofuClient`: the blocking client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

import httpx
from pydantic import TypeAdapter

from rofu.client._calls import (
    ACTIVATED,
    ARM,
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
        self._retry = Retry(retries, max_backoff_s)
        self._http = httpx.Client(
            base_url=base_url, headers=auth_headers(api_key), timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> RofuClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def send(self, call: Call) -> httpx.Response:
        """Send `call`, retrying as the package docstring says; the last response."""
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
        explain: bool = False,
        unit_id: str | None = None,
    ) -> SelectResponse:
        """POST /v1/select: a decision (the same one again for a repeated `event_id`).

        `context` is a vector of context_dim numbers or an object of named features;
        `arm_features` gives candidates per-request features (arm-feature models); with
        `defer`, the decision is trained on only once `activate` activates it;
        `baseline_arm` is the app's own choice (served in apprentice mode, and to a
        holdout's units); with `explain`, the answer's `explanations` say which features
        moved each mean; `unit_id` (a user, a device) keeps a unit in one holdout group."""
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
        return parse(SELECTED, self.send(call))

    def reward(
        self, event_id: str, value: float, *, metrics: Mapping[str, float] | None = None
    ) -> RewardResponse:
        """POST /v1/reward: the reward of a decision (a repeat is `duplicate`), with any
        guardrail `metrics` (name -> number) that GET /v1/report compares."""
        return parse(REWARDED, self.send(reward_call(event_id, value, metrics)))

    def report(self, since: Moment = None) -> ReportResponse:
        """GET /v1/report (admin key): rofu against its holdout, from `since` on."""
        return parse(REPORT, self.send(report_call(since)))

    def activate(self, event_id: str) -> ActivateResponse:
        """POST /v1/events/{event_id}/activate: a deferred decision may be trained on
        (idempotent; `status` says `late` when it came too late to count)."""
        return parse(ACTIVATED, self.send(activate_call(event_id)))

    def arms(self) -> list[ArmResponse]:
        """GET /v1/arms: every arm, active and retired."""
        return parse(ARMS, self.send(Call("GET", "/v1/arms")))

    def add_arm(self, arm_id: str, features: Sequence[float] | None = None) -> ArmResponse:
        """POST /v1/arms (admin key)."""
        body = {"id": arm_id, "features": None if features is None else list(features)}
        return parse(ARM, self.send(Call("POST", "/v1/arms", body)))

    def retire_arm(self, arm_id: str) -> ArmResponse:
        """DELETE /v1/arms/{id} (admin key)."""
        return parse(ARM, self.send(Call("DELETE", f"/v1/arms/{arm_id}")))

    def model(self) -> ModelResponse:
        """GET /v1/model: the served checkpoint and its settings."""
        return parse(MODEL, self.send(Call("GET", "/v1/model")))

    def checkpoints(self, page_size: int = 50) -> Iterator[CheckpointInfo]:
        """Every stored checkpoint, newest first, following the pages' `Link` headers."""
        return self._pages(checkpoints_call(page_size), CHECKPOINTS)

    def export(
        self, since: Moment = None, until: Moment = None, *, page_size: int = 1000
    ) -> Iterator[DecisionRecord]:
        """GET /v1/decisions (admin key): every logged decision in `[since, until)`, oldest
        first, with its reward and activation (`active` is false for a deferred decision
        not activated in time), one page at a time."""
        return self._pages(export_call(since, until, page_size), RECORDS)

    def _pages(self, first: Call, adapter: TypeAdapter[list[T]]) -> Iterator[T]:
        """The items of `first`'s page and of every page its `Link` headers lead to."""
        call: Call | None = first
        while call is not None:
            response = self.send(call)
            yield from parse(adapter, response)
            call = next_page(response)
