"""GET /healthz (process alive) and GET /readyz (model loaded, database takes writes)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import DatabaseCheckDep, FollowerDep
from rofu.service.api.schemas import HealthResponse

router = APIRouter(route_class=JsonRoute, tags=["health"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """The process is alive and its event loop answers."""
    return HealthResponse(status="ok")


@router.get("/readyz", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def readyz(check_database: DatabaseCheckDep, follower: FollowerDep) -> JSONResponse:
    """Ready to serve: the database takes reads and writes (asked within
    readyz_timeout_seconds; the process's writes not failing for longer than
    readyz_write_failure_seconds) and the newest checkpoint is loaded (or none exists yet)."""
    database = await check_database()
    model = follower.state
    ready = database.ok and model.ready
    checks = {"database": database.state, "model": model.value}
    if database.cause is not None:
        checks["database_cause"] = database.cause
    if not database.ok and database.detail:
        checks["database_detail"] = database.detail
    body = HealthResponse(status="ready" if ready else "not ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
