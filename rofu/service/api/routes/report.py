"""GET /report: rofu against its holdout, with intervals and guardrails (admin)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from rofu.client.experiment import ReportResponse
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import AdminAuth, SessionsDep, SettingsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.routes.decisions import Moment
from rofu.service.api.schemas import error_responses
from rofu.service.experiment.report import holdout_report
from rofu.service.log.pages import parse_moment

router = APIRouter(
    route_class=JsonRoute,
    prefix=f"{API_PREFIX}/report",
    tags=["experiment"],
    dependencies=[AdminAuth],
    responses=error_responses(401, 403),
)


@router.get("", response_model=ReportResponse, responses=error_responses(422, 503))
async def report(
    sessions: SessionsDep, settings: SettingsDep, since: Moment = None
) -> ReportResponse:
    """rofu against the holdout (ROFU_HOLDOUT_SHARE) on the decisions made while it ran,
    from `since` on: each group's mean reward with its interval, the lift, an anytime-valid
    test, each guardrail metric likewise, and a sample-ratio check."""
    start = None if since is None else parse_moment(since, "since")
    return await run_in_threadpool(holdout_report, sessions, settings, start)
