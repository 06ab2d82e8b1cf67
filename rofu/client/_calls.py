"""What both clients share: the calls they make, how answers are read, when to retry."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from rofu.client._errors import RofuError
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

T = TypeVar("T")
RETRY_STATUSES = frozenset({503})
Context = Sequence[float] | Mapping[str, Any]  # a vector, or named features (README)
Moment = datetime | str | None  # an ISO 8601 date or time; without an offset, UTC

SELECTED = TypeAdapter(SelectResponse)
REWARDED = TypeAdapter(RewardResponse)
REPORT = TypeAdapter(ReportResponse)
ARM = TypeAdapter(ArmResponse)
ARMS = TypeAdapter(list[ArmResponse])
MODEL = TypeAdapter(ModelResponse)
CHECKPOINTS = TypeAdapter(list[CheckpointInfo])
ACTIVATED = TypeAdapter(ActivateResponse)
RECORDS = TypeAdapter(list[DecisionRecord])


@dataclass(frozen=True)
class Call:
    """One API call: what to send and how to read the answer."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


def _features(value: Context) -> list[float] | dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else list(value)


def select_call(
    context: Context,
    event_id: str | None,
    arms: Sequence[str] | None,
    exclude: Sequence[str] | None,
    explore: bool,
    defer: bool = False,
    arm_features: Mapping[str, Context] | None = None,
    baseline_arm: str | None = None,
    explain: bool = False,
    unit_id: str | None = None,
) -> Call:
    """POST /v1/select with the arguments given (None: left out)."""
    body: dict[str, Any] = {
        "context": _features(context),
        "event_id": event_id or uuid.uuid4().hex,  # drawn once: every retry repeats it
        "explore": explore,
        "defer": defer,
    }
    if arms is not None:
        body["arms"] = list(arms)
    if exclude is not None:
        body["exclude"] = list(exclude)
    if arm_features is not None:
        body["arm_features"] = {arm: _features(z) for arm, z in arm_features.items()}
    if baseline_arm is not None:
        body["baseline_arm"] = baseline_arm
    if explain:  # left out otherwise, for servers that predate it
        body["explain"] = True
    if unit_id is not None:
        body["unit_id"] = unit_id
    return Call("POST", "/v1/select", body)


def reward_call(event_id: str, value: float, metrics: Mapping[str, float] | None = None) -> Call:
    """POST /v1/reward (guardrail `metrics` left out when None)."""
    body: dict[str, Any] = {"event_id": event_id, "value": value}
    if metrics is not None:
        body["metrics"] = dict(metrics)
    return Call("POST", "/v1/reward", body)


def report_call(since: Moment) -> Call:
    """GET /v1/report."""
    params = {} if since is None else {"since": _moment(since)}
    return Call("GET", "/v1/report", params=params)


def activate_call(event_id: str) -> Call:
    """POST /v1/events/{event_id}/activate."""
    return Call("POST", f"/v1/events/{quote(event_id, safe='')}/activate")


def checkpoints_call(page_size: int) -> Call:
    """GET /v1/model/checkpoints, the first page."""
    return Call("GET", "/v1/model/checkpoints", params={"limit": page_size})


def _moment(moment: datetime | str) -> str:
    return moment.isoformat() if isinstance(moment, datetime) else moment


def export_call(since: Moment, until: Moment, page_size: int) -> Call:
    """GET /v1/decisions, the first page."""
    params: dict[str, Any] = {"limit": page_size}
    for name, moment in (("since", since), ("until", until)):
        if moment is not None:
            params[name] = _moment(moment)
    return Call("GET", "/v1/decisions", params=params)


def parse(adapter: TypeAdapter[T], response: httpx.Response) -> T:
    """The answer as `adapter`'s type, or the RofuError its error body describes."""
    if response.status_code >= 400:
        raise RofuError.from_response(response)
    return adapter.validate_json(response.content)


def next_page(response: httpx.Response) -> Call | None:
    """The call of a `Link` header's `rel="next"` target, if any."""
    link = response.links.get("next")
    return None if link is None else Call("GET", str(link["url"]))


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers carrying `api_key` (none without one)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}


class Retry:
    """When to try again: a 503 or a failed connection, honouring Retry-After.

    Each wait is stretched by a random factor in [1, 1.5) (never shorter than the server
    asked), so that clients refused together do not all come back in the same instant.
    """

    def __init__(
        self, retries: int, max_backoff_s: float, rng: random.Random | None = None
    ) -> None:
        if retries < 0 or max_backoff_s < 0:
            raise ValueError("retries and max_backoff_s must be >= 0")
        self.retries = retries
        self.max_backoff_s = max_backoff_s
        self._rng = rng or random.Random()

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before attempt `attempt + 1`."""
        wait = min(0.1 * 2**attempt, self.max_backoff_s)
        if response is not None:
            with contextlib.suppress(ValueError):  # an HTTP date: keep the backoff
                wait = float(response.headers.get("retry-after", wait))
        wait *= self._rng.uniform(1.0, 1.5)
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
