"""The arm catalogue: GET /arms, POST /arms, DELETE /arms/{arm_id}."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path
from starlette.concurrency import run_in_threadpool

from rofu.client.schemas import ARM_ID_PATTERN, ArmRequest, ArmResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import (
    AdminAuth,
    CatalogueDep,
    ClientAuth,
    RedisBusDep,
    SessionsDep,
    SettingsDep,
)
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import error_responses
from rofu.service.db import arms as arm_rows
from rofu.service.db.tables import ArmRow
from rofu.service.deciding.catalogue import ARMS_NOTICE, CatalogueCache
from rofu.service.errors import InvalidInput
from rofu.service.lifecycle.redis_bus import RedisBus, send_notice

router = APIRouter(route_class=JsonRoute, prefix=f"{API_PREFIX}/arms", tags=["arms"])
ERRORS = error_responses(401, 403, 404, 409, 422, 503)
ArmPath = Annotated[str, Path(pattern=ARM_ID_PATTERN)]
log = logging.getLogger("rofu.arms")


def _view(row: ArmRow) -> ArmResponse:
    return ArmResponse(id=row.id, slot=row.slot, features=row.features, active=row.active)


@router.get(
    "",
    response_model=list[ArmResponse],
    responses=error_responses(401),
    dependencies=[ClientAuth],
)
async def list_arms(sessions: SessionsDep) -> list[ArmResponse]:
    """Every arm, active and retired."""
    rows = await run_in_threadpool(arm_rows.list_arms, sessions)
    return [_view(row) for row in rows]


@router.post(
    "",
    response_model=ArmResponse,
    status_code=201,
    responses={**ERRORS, **error_responses(415)},  # a body not sent as JSON
    dependencies=[AdminAuth],
)
async def add_arm(
    body: ArmRequest,
    settings: SettingsDep,
    sessions: SessionsDep,
    catalogue: CatalogueDep,
    bus: RedisBusDep,
) -> ArmResponse:
    """Add an arm; it can be selected (and explored) at once."""
    width = 0 if body.features is None else len(body.features)
    if width != settings.arm_feature_dim:
        raise InvalidInput(
            f"features: expected {settings.arm_feature_dim} values, got {width}", field="features"
        )
    row = await run_in_threadpool(
        arm_rows.add_arm, sessions, body.id, body.features, settings.max_arms
    )
    await _changed(catalogue, bus)
    return _view(row)


@router.delete("/{arm_id}", response_model=ArmResponse, responses=ERRORS, dependencies=[AdminAuth])
async def retire_arm(
    arm_id: ArmPath, sessions: SessionsDep, catalogue: CatalogueDep, bus: RedisBusDep
) -> ArmResponse:
    """Retire an arm: it is never selected again (its history stays)."""
    row = await run_in_threadpool(arm_rows.retire_arm, sessions, arm_id)
    await _changed(catalogue, bus)
    return _view(row)


async def _changed(catalogue: CatalogueCache, bus: RedisBus | None) -> None:
    """Reload this replica's catalogue and tell the others to reload theirs (the poll is
    the fallback when the notice is lost: ROFU_CHECKPOINT_POLL_SECONDS +
    ROFU_ARM_REFRESH_SECONDS at most)."""
    await run_in_threadpool(catalogue.refresh)
    await run_in_threadpool(send_notice, bus, ARMS_NOTICE, "arm catalogue")
