"""POST /select."""

from __future__ import annotations

from fastapi import APIRouter

from rofu.client.schemas import SelectResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import BatcherDep, ClientAuth, MetricsDep, SettingsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import SelectRequest, error_responses
from rofu.service.deciding.select import decide

router = APIRouter(
    route_class=JsonRoute, prefix=API_PREFIX, tags=["decisions"], dependencies=[ClientAuth]
)
ERRORS = error_responses(401, 403, 409, 413, 415, 422, 503)


@router.post("/select", response_model=SelectResponse, responses=ERRORS)
async def select(
    body: SelectRequest, settings: SettingsDep, batcher: BatcherDep, metrics: MetricsDep
) -> SelectResponse:
    """Choose an arm for a context: the argmax of ROFU's upper confidence bound."""
    return await decide(body, settings, batcher, metrics)
