"""Rewards as domain logic: the one function behind `POST /v1/reward` (and any facade that
stores a reward, such as the Personalizer-compatible one), and the micro-batch handler
that stores them.

The first value wins: a repeat with the same value is a duplicate (never counted twice), a
different value is a 409, or, for a caller that keeps the first value (the
Personalizer-compatible facade, as Personalizer takes every reward post), an ignored
duplicate: counted in the row's `repeats` and as `rofu_rewards_total{outcome="ignored"}`,
its value never used. A reward after its decision's window closed, or after a
checkpoint consumed the decision, is stored flagged `late` and never trained on.
Concurrent rewards are stored together, one transaction per micro-batch: a batch takes
the rewards that queued while the one before it was written (no wait when idle).
"""

from __future__ import annotations

from rofu.service.api.deadline import within
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import SessionFactory
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.deciding.select import stored_scores
from rofu.service.errors import Conflict, InvalidInput, NotFound
from rofu.service.metrics import ServiceMetrics
from rofu.service.rewards.metrics import count_reward
from rofu.service.settings import Settings

RewardOutcome = reward_rows.RewardOutcome
RewardPost = reward_rows.RewardPost
Stored = reward_rows.Stored
RewardBatcher = MicroBatcher[RewardPost, Stored]

__all__ = ["RewardBatch", "RewardBatcher", "RewardOutcome", "RewardPost", "record_reward"]


class RewardBatch:
    """The micro-batcher's handler for rewards: a batch in one transaction, each post
    with its own outcome or error (`rofu.service.db.rewards.attach_rewards`); a database failure
    fails every post of the batch.

    Args:
        sessions: the database.
        window_seconds: the reward window (`ROFU_REWARD_WINDOW_SECONDS`).
    """

    def __init__(self, sessions: SessionFactory, window_seconds: float) -> None:
        self._sessions = sessions
        self._window_seconds = window_seconds

    def __call__(self, batch: list[RewardPost]) -> list[Stored]:
        """Store the batch's rewards, in order, as if posted one after the other."""
        return reward_rows.attach_rewards(self._sessions, batch, self._window_seconds)


async def record_reward(
    event_id: str,
    value: float,
    settings: Settings,
    rewards: RewardBatcher,
    metrics: ServiceMetrics,
    *,
    keep_first: bool = False,
    guardrails: dict[str, float] | None = None,
) -> RewardOutcome:
    """Store the reward of `event_id`'s decision; durable once this returns. Counts it in
    `rofu_rewards_total` by outcome, and a reward stored now in the business metrics.
    `keep_first`: another value for a rewarded event is ignored, not a `Conflict`.
    `guardrails`: the metrics stored with the value (part of what a repeat must match).

    Raises:
        InvalidInput: `value` or a metric beyond `ROFU_MAX_ABS_REWARD` (field `value`,
            `metrics.<name>`).
        NotFound: no decision has this event id.
        Conflict: the event already has a different reward (unless `keep_first`).
        Unavailable: the database did not answer within the request deadline.
    """
    counter = metrics.rewards
    limit = settings.max_abs_reward
    if abs(value) > limit:
        raise InvalidInput(
            f"value: {value} is beyond the bound +-{limit:g} (ROFU_MAX_ABS_REWARD)",
            field="value",
        )
    for name, number in (guardrails or {}).items():
        if abs(number) > limit:
            raise InvalidInput(
                f"metrics.{name}: {number} is beyond the bound +-{limit:g} (ROFU_MAX_ABS_REWARD)",
                field=f"metrics.{name}",
            )
    post = RewardPost(event_id, value, keep_first, guardrails or None)
    outcome = await within(settings.request_deadline_seconds, rewards.submit(post))
    if isinstance(outcome, NotFound | Conflict):
        counter.labels("unknown_event" if isinstance(outcome, NotFound) else "conflict").inc()
        raise outcome
    counter.labels(_outcome(outcome)).inc()
    if not outcome.duplicate and outcome.decision is not None:  # stored now: count it once
        row = outcome.decision
        count_reward(metrics, row, stored_scores(row), outcome.value)
    return outcome


def _outcome(outcome: RewardOutcome) -> str:
    """The metric's outcome: a repeat is a duplicate, late or not, or ignored if its value
    differed."""
    if outcome.ignored:
        return "ignored"
    if outcome.duplicate:
        return "duplicate"
    return "late" if outcome.late else "accepted"
