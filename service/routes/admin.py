"""Operator endpoints for rollback: GET/PUT/DELETE /admin/pin."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service import pinning
from service.db import repository
from service.deps import AdminAuth, RuntimeDep
from service.runtime import Runtime
from service.schemas import error_responses

router = APIRouter(
    prefix="/admin",
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


async def _state(runtime: Runtime) -> PinResponse:
    await run_in_threadpool(runtime.sync)
    pinned = await run_in_threadpool(repository.get_pin, runtime.sessions)
    current = runtime.holder.current
    return PinResponse(pinned=pinned, serving=0 if current is None else current.version)


@router.get("/pin", response_model=PinResponse)
async def get_pin(runtime: RuntimeDep) -> PinResponse:
    """The pinned version (null: the newest is served)."""
    return await _state(runtime)


@router.put("/pin", response_model=PinResponse, responses=error_responses(400, 404, 409, 422))
async def put_pin(body: PinRequest, runtime: RuntimeDep) -> PinResponse:
    """Roll back: serve this stored checkpoint on every replica until unpinned."""
    await run_in_threadpool(
        pinning.pin,
        runtime.sessions,
        runtime.store,
        runtime.settings.net_config(),
        body.version,
        runtime.redis,
    )
    return await _state(runtime)


@router.delete("/pin", response_model=PinResponse)
async def delete_pin(runtime: RuntimeDep) -> PinResponse:
    """Unpin: serve the newest checkpoint again."""
    await run_in_threadpool(pinning.unpin, runtime.sessions, runtime.redis)
    return await _state(runtime)
