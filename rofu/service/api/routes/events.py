"""POST /events/{event_id}/activate."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from rofu.client.schemas import ActivateResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import ClientAuth, MetricsDep, SessionsDep, SettingsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import error_responses
from rofu.service.rewards.activation import Activation, activate

router = APIRouter(
    route_class=JsonRoute,
    prefix=f"{API_PREFIX}/events",
    tags=["decisions"],
    dependencies=[ClientAuth],
)
ERRORS = error_responses(400, 401, 403, 404, 422, 503)


@router.post("/{event_id}/activate", response_model=ActivateResponse, responses=ERRORS)
async def activate_event(
    event_id: str, settings: SettingsDep, sessions: SessionsDep, metrics: MetricsDep
) -> ActivateResponse:
    """Activate a decision logged with `defer`: it is trained on only once activated
    within its window; idempotent; a decision never deferred is already active."""
    return view(await activate(event_id, settings, sessions, metrics))


def view(activation: Activation) -> ActivateResponse:
    """The API view of an activation."""
    status: Literal["activated", "already_active", "late"] = "already_active"
    if activation.deferred and activation.late:
        status = "late"
    elif activation.deferred and not activation.duplicate:
        status = "activated"
    return ActivateResponse(
        event_id=activation.event_id,
        status=status,
        deferred=activation.deferred,
        activated_at=activation.activated_at,
        duplicate=activation.duplicate,
    )
