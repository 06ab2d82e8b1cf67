"""POST /reward."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from service.db import repository
from service.deadline import within
from service.decisions import stored_scores
from service.deps import ClientAuth, MetricsDep, SessionsDep, SettingsDep
from service.errors import Conflict, InvalidInput, NotFound
from service.reward_metrics import count_reward
from service.routes import API_PREFIX
from service.schemas import RewardRequest, RewardResponse, error_responses

router = APIRouter(prefix=API_PREFIX, tags=["decisions"], dependencies=[ClientAuth])
ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 503)


@router.post("/reward", response_model=RewardResponse, responses=ERRORS)
async def reward(
    body: RewardRequest, settings: SettingsDep, sessions: SessionsDep, metrics: MetricsDep
) -> RewardResponse:
    """Attach a reward to a decision; durable before the 2xx; the first value wins; one
    after the decision's window is stored flagged `late`."""
    counter = metrics.rewards
    limit = settings.max_abs_reward
    if abs(body.value) > limit:
        raise InvalidInput(
            f"value: {body.value} is beyond the bound +-{limit:g} (ROFU_MAX_ABS_REWARD)",
            field="value",
        )
    try:
        outcome = await within(
            settings.request_deadline_seconds,
            run_in_threadpool(
                repository.attach_reward,
                sessions,
                body.event_id,
                body.value,
                settings.reward_window_seconds,
            ),
        )
    except NotFound:
        counter.labels("unknown_event").inc()
        raise
    except Conflict:
        counter.labels("conflict").inc()
        raise
    counter.labels(_outcome(outcome)).inc()
    if not outcome.duplicate and outcome.decision is not None:  # stored now: count it once
        row = outcome.decision
        count_reward(metrics, row, stored_scores(row), outcome.value)
    return RewardResponse(
        event_id=outcome.event_id,
        value=outcome.value,
        duplicate=outcome.duplicate,
        late=outcome.late,
    )


def _outcome(outcome: repository.RewardOutcome) -> str:
    """The metric's outcome: a repeat is a duplicate, late or not."""
    if outcome.duplicate:
        return "duplicate"
    return "late" if outcome.late else "accepted"
