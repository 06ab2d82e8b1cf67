"""The Personalizer-compatible facade: Azure Personalizer v1.0's Rank, Reward and Activate.

A Personalizer client pointed at rofu (endpoint `http://host:port`, its key in
`Ocp-Apim-Subscription-Key` or as a bearer token) works unchanged;
`rofu.service.personalizer.facade`
translates each call to rofu's own domain code, and every error of these paths takes
Personalizer's shape (`rofu.service.personalizer.schemas.reshape`, applied by
`rofu.service.api.app`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from rofu.client.schemas import EVENT_ID_PATTERN
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import (
    BatcherDep,
    MetricsDep,
    RewardBatcherDep,
    SessionsDep,
    SettingsDep,
    SubscriberAuth,
)
from rofu.service.personalizer import facade as personalizer
from rofu.service.personalizer.schemas import (
    ERRORS,
    PREFIX,
    PersonalizerRewardRequest,
    RankRequest,
    RankResponse,
)

router = APIRouter(
    route_class=JsonRoute, prefix=PREFIX, tags=["personalizer"], dependencies=[SubscriberAuth]
)
EventId = Annotated[
    str,
    Path(
        alias="eventId",
        description="The eventId of a Rank call (1-128 characters of [A-Za-z0-9_.:-])",
        json_schema_extra={"pattern": EVENT_ID_PATTERN},
    ),
]


@router.post("/rank", status_code=201, response_model=RankResponse, responses=ERRORS)
async def rank(
    body: RankRequest, settings: SettingsDep, batcher: BatcherDep, metrics: MetricsDep
) -> RankResponse:
    """Rank the actions for a context: rofu's decision (as /v1/select), the chosen action
    first (`rewardActionId`), every action with its exact probability."""
    return await personalizer.rank(body, settings, batcher, metrics)


@router.post("/events/{eventId}/reward", status_code=204, responses=ERRORS)
async def reward(
    event_id: EventId,
    body: PersonalizerRewardRequest,
    settings: SettingsDep,
    rewards: RewardBatcherDep,
    metrics: MetricsDep,
) -> Response:
    """Report the reward of a ranked event (as /v1/reward: the first value wins; a repeat,
    with any value, is a 204)."""
    await personalizer.reward(event_id, body.value, settings, rewards, metrics)
    return Response(status_code=204)


@router.post("/events/{eventId}/activate", status_code=204, responses=ERRORS)
async def activate(
    event_id: EventId, settings: SettingsDep, sessions: SessionsDep, metrics: MetricsDep
) -> Response:
    """Activate an event ranked with `deferActivation` (as /v1/events/{event_id}/activate)."""
    await personalizer.activate_event(event_id, settings, sessions, metrics)
    return Response(status_code=204)
