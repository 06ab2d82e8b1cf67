"""The rofu client: `RofuClient` (blocking) and `AsyncRofuClient` (asyncio), over httpx.

    from datetime import UTC, datetime, timedelta

    from rofu.client import RofuClient

    with RofuClient("http://127.0.0.1:8000", api_key="...") as rofu:
        decision = rofu.select([0.1, 0.5, -0.2, 0.0, 1.0, 0.3, 0.0, 0.7])
        rofu.reward(decision.event_id, 1.0)
        shown = rofu.select([0.3, 0.1, 0.0, 0.2, 0.5, 0.0, 0.1, 0.9], defer=True)
        rofu.activate(shown.event_id)  # trained on only once the app showed it
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
        for record in rofu.export(since=an_hour_ago):  # the decision log (admin key)
            print(record.event_id, record.arm, record.reward, record.active)

It needs httpx and pydantic only (`pip install rofu`; the service is `rofu[server]`).
Requests and responses are the API's wire schemas (`rofu.client.schemas`), which the
service's OpenAPI schema is generated from. A request that gets a 503 (`unavailable`: a
database failure; `overloaded`: a replica's full /select queue) or cannot connect is
retried after the server's `Retry-After` (or an exponential backoff), stretched by a
random factor of 1 to 1.5 so that refused clients do not return together, at most
`retries` times and never waiting longer than `max_backoff_s` at once. `select` draws its
`event_id` before the first attempt, so a retry repeats the same request and the service
returns the one decision it stored. Errors are `RofuError` with the server's code,
message and field. `checkpoints` and `export` follow the server's `Link` headers page by
page, holding one page at a time.
"""

from rofu.client._async import AsyncRofuClient
from rofu.client._calls import Call, Context, Moment
from rofu.client._errors import RofuError
from rofu.client._sync import RofuClient
from rofu.client.experiment import ReportResponse
from rofu.client.records import DecisionRecord
from rofu.client.schemas import (
    ActivateResponse,
    ArmProbability,
    ArmResponse,
    ArmScore,
    CheckpointInfo,
    ModelResponse,
    RewardResponse,
    SelectResponse,
)

__all__ = [
    "ActivateResponse",
    "ArmProbability",
    "ArmResponse",
    "ArmScore",
    "AsyncRofuClient",
    "Call",
    "CheckpointInfo",
    "Context",
    "DecisionRecord",
    "ModelResponse",
    "Moment",
    "ReportResponse",
    "RewardResponse",
    "RofuClient",
    "RofuError",
    "SelectResponse",
]
