"""Rewards as domain logic: the one function behind `POST /v1/reward` (and any facade that
stores a reward, such as the Personalizer-compatible one).

The first value wins: a repeat with the same value is a duplicate (never counted twice), a
different value is a 409. A reward after its decision's window closed, or after a
checkpoint consumed the decision, is stored flagged `late` and never trained on.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from service.db import repository
from service.db.engine import SessionFactory
from service.deadline import within
from service.decisions import stored_scores
from service.errors import Conflict, InvalidInput, NotFound
from service.metrics import ServiceMetrics
from service.reward_metrics import count_reward
from service.settings import Settings

RewardOutcome = repository.RewardOutcome

__all__ = ["RewardOutcome", "record_reward"]


async def record_reward(
    event_id: str,
    value: float,
    settings: Settings,
    sessions: SessionFactory,
    metrics: ServiceMetrics,
) -> RewardOutcome:
    """Store the reward of `event_id`'s decision; durable once this returns. Counts it in
    `rofu_rewards_total` by outcome, and a reward stored now in the business metrics.

    Raises:
        InvalidInput: `value` beyond `ROFU_MAX_ABS_REWARD` (field `value`).
        NotFound: no decision has this event id.
        Conflict: the event already has a different reward.
        Unavailable: the database did not answer within the request deadline.
    """
    counter = metrics.rewards
    limit = settings.max_abs_reward
    if abs(value) > limit:
        raise InvalidInput(
            f"value: {value} is beyond the bound +-{limit:g} (ROFU_MAX_ABS_REWARD)",
            field="value",
        )
    try:
        outcome = await within(
            settings.request_deadline_seconds,
            run_in_threadpool(
                repository.attach_reward,
                sessions,
                event_id,
                value,
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
    return outcome


def _outcome(outcome: RewardOutcome) -> str:
    """The metric's outcome: a repeat is a duplicate, late or not."""
    if outcome.duplicate:
        return "duplicate"
    return "late" if outcome.late else "accepted"
