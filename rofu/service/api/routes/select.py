"""POST /select, and POST /select/validate: the same request checked, nothing decided."""

from __future__ import annotations

from fastapi import APIRouter

from rofu.client.schemas import SelectResponse, ValidateResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import BatcherDep, ClientAuth, MetricsDep, SettingsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import SelectRequest, error_responses
from rofu.service.deciding.select import decide, request_vectors

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


@router.post(
    "/select/validate",
    response_model=ValidateResponse,
    responses=error_responses(401, 403, 413, 415, 422),
)
async def validate(body: SelectRequest, settings: SettingsDep) -> ValidateResponse:
    """Check a /select request as /select checks it (its key, its body, its context's and
    arm features' lengths and bounds, named features hashed) and return the vectors the
    model would read; nothing is scored or stored. Also the load benchmark's floor: the
    same middleware and JSON stack as /select, without scoring or the database."""
    context, arm_features = await request_vectors(body, settings)
    return ValidateResponse(
        valid=True,
        context=list(context),
        arm_features={arm: list(values) for arm, values in arm_features.items()},
    )
