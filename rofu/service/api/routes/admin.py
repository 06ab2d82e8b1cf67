"""Operator endpoints: rollback (GET/PUT/DELETE /admin/pin) and the evaluation gate's
decisions by hand (PUT /admin/checkpoints/{version})."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from rofu.client.schemas import CheckpointInfo
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import AdminAuth, FollowerDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.routes.model import checkpoint_info
from rofu.service.api.schemas import error_responses
from rofu.service.lifecycle.follower import CheckpointFollower

router = APIRouter(
    route_class=JsonRoute,
    prefix=f"{API_PREFIX}/admin",
    tags=["admin"],
    dependencies=[AdminAuth],
    responses=error_responses(401, 403),
)


class PinRequest(BaseModel):
    """Which stored checkpoint to serve."""

    model_config = ConfigDict(strict=True, extra="forbid")
    version: int = Field(ge=1, le=2**31 - 1)  # the checkpoints.version column is a 32-bit integer


class PinResponse(BaseModel):
    """The pin and the version this replica serves after applying it."""

    pinned: int | None
    serving: int


async def _state(follower: CheckpointFollower) -> PinResponse:
    await run_in_threadpool(follower.sync)
    pinned = await run_in_threadpool(follower.pinned)
    return PinResponse(pinned=pinned, serving=follower.serving)


@router.get("/pin", response_model=PinResponse)
async def get_pin(follower: FollowerDep) -> PinResponse:
    """The pinned version (null: the newest is served)."""
    return await _state(follower)


@router.put("/pin", response_model=PinResponse, responses=error_responses(404, 409, 415, 422))
async def put_pin(body: PinRequest, follower: FollowerDep) -> PinResponse:
    """Roll back: serve this stored checkpoint on every replica until unpinned."""
    await run_in_threadpool(follower.pin, body.version)
    return await _state(follower)


@router.delete("/pin", response_model=PinResponse)
async def delete_pin(follower: FollowerDep) -> PinResponse:
    """Unpin: serve the newest checkpoint again."""
    await run_in_threadpool(follower.unpin)
    return await _state(follower)


class GateRequest(BaseModel):
    """An operator's gate decision on a stored checkpoint."""

    model_config = ConfigDict(strict=True, extra="forbid")
    status: Literal["promoted", "rejected"]
    reason: str | None = Field(default=None, max_length=1024)


class GateResponse(BaseModel):
    """The checkpoint after the decision and the version this replica serves after it."""

    checkpoint: CheckpointInfo
    serving: int


@router.put(
    "/checkpoints/{version}",
    response_model=GateResponse,
    responses=error_responses(404, 409, 415, 422),
)
async def put_checkpoint(
    version: Annotated[int, Path(ge=1, le=2**31 - 1)], body: GateRequest, follower: FollowerDep
) -> GateResponse:
    """Promote (servable, served if newest) or reject (never served) a checkpoint by hand."""
    row = await run_in_threadpool(follower.decide, version, body.status, body.reason)
    return GateResponse(checkpoint=checkpoint_info(row), serving=follower.serving)
