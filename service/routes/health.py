"""GET /healthz (process alive) and GET /readyz (model loaded, database reachable)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from service.deps import DatabaseCheckDep, FollowerDep
from service.schemas import HealthResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """The process is alive and its event loop answers."""
    return HealthResponse(status="ok")


@router.get("/readyz", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def readyz(database_ok: DatabaseCheckDep, follower: FollowerDep) -> JSONResponse:
    """Ready to serve: the database answers and the newest checkpoint is loaded (or none
    exists yet, a cold start)."""
    database = "ok" if await run_in_threadpool(database_ok) else "unreachable"
    model = follower.state
    ready = database == "ok" and model.ready
    body = HealthResponse(
        status="ready" if ready else "not ready",
        checks={"database": database, "model": model.value},
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
