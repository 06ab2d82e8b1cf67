"""Deferred activation as domain logic: the one function behind
`POST /v1/events/{event_id}/activate` (and any facade that activates a decision).

A decision logged with `"defer": true` is trained on and evaluated only once activated.
Activation is idempotent: a repeat says `duplicate`, a decision that was never deferred
is already active and nothing changes. An activation after the decision's reward window
closed (`ROFU_REWARD_WINDOW_SECONDS`), or after the trainer consumed the decision, is
stored flagged late and the decision is never trained on; the answer says so. A decision
never activated is consumed by the trainer at the end of its window without being
trained on, and counted as expired (`rofu_deferred_decisions_total`).
"""

from __future__ import annotations

import re

from starlette.concurrency import run_in_threadpool

from rofu.client.schemas import EVENT_ID_PATTERN
from rofu.service.api.deadline import within
from rofu.service.db.deferral import Activation, activate_decision
from rofu.service.db.engine import SessionFactory
from rofu.service.errors import InvalidInput
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings

__all__ = ["Activation", "activate"]


async def activate(
    event_id: str, settings: Settings, sessions: SessionFactory, metrics: ServiceMetrics
) -> Activation:
    """Activate the deferred decision of `event_id`; durable once this returns.

    Raises:
        InvalidInput: `event_id` is not an event id.
        NotFound: no decision has this event id.
        Unavailable: the database did not answer within the request deadline.
    """
    if not re.fullmatch(EVENT_ID_PATTERN, event_id):
        raise InvalidInput(
            f"event_id: {event_id[:140]!r} is not 1-128 characters of [A-Za-z0-9_.:-]",
            field="event_id",
        )
    window = settings.reward_window_seconds
    return await within(
        settings.request_deadline_seconds,
        run_in_threadpool(_activate_counted, sessions, event_id, window, metrics),
    )


def _activate_counted(
    sessions: SessionFactory, event_id: str, window: float, metrics: ServiceMetrics
) -> Activation:
    """Activate and count in the worker thread, so a stored activation is counted even
    when the request's deadline ran out meanwhile (its retry is a duplicate)."""
    activation = activate_decision(sessions, event_id, window)
    if activation.created:
        metrics.deferred.labels("late" if activation.late else "activated").inc()
    return activation
