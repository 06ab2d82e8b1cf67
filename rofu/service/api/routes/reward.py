"""POST /reward."""

from __future__ import annotations

from fastapi import APIRouter

from rofu.client.schemas import RewardRequest, RewardResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import ClientAuth, MetricsDep, RewardBatcherDep, SettingsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import error_responses
from rofu.service.rewards.record import record_reward

router = APIRouter(
    route_class=JsonRoute, prefix=API_PREFIX, tags=["decisions"], dependencies=[ClientAuth]
)
ERRORS = error_responses(401, 403, 404, 409, 413, 415, 422, 503)


@router.post("/reward", response_model=RewardResponse, responses=ERRORS)
async def reward(
    body: RewardRequest, settings: SettingsDep, rewards: RewardBatcherDep, metrics: MetricsDep
) -> RewardResponse:
    """Attach a reward (and any guardrail metrics) to a decision; durable before the 2xx;
    the first value wins; one after the decision's window is stored flagged `late`."""
    outcome = await record_reward(
        body.event_id, body.value, settings, rewards, metrics, guardrails=body.metrics
    )
    return RewardResponse(
        event_id=outcome.event_id,
        value=outcome.value,
        duplicate=outcome.duplicate,
        late=outcome.late,
    )
