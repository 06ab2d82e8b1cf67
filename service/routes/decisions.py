"""GET /decisions: the decision log with rewards, a page at a time (admin)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from models.scores import ArmScore
from service.decision_log import (
    MOMENT_PATTERN,
    LoggedDecision,
    Window,
    decode_cursor,
    encode_cursor,
    parse_moment,
    read_page,
)
from service.deps import AdminAuth, SessionsDep
from service.routes import API_PREFIX
from service.schemas import error_responses

MAX_PAGE = 1000
router = APIRouter(
    prefix=f"{API_PREFIX}/decisions",
    tags=["decisions"],
    dependencies=[AdminAuth],
    responses=error_responses(401, 403),
)


class DecisionRecord(BaseModel):
    """A logged decision and its reward (the rows `rofu export` writes)."""

    event_id: str
    created_at: datetime
    context: list[float]
    candidates: list[str]
    arm: str
    slot: int
    propensity: float
    probabilities: list[float] | None = Field(
        description="Per candidate, in `candidates` order; null when only `propensity` is known"
    )
    model_version: int
    policy: str
    explore: bool
    scores: list[ArmScore]
    reward: float | None
    reward_received_at: datetime | None
    late: bool | None = Field(description="The reward came after the decision's window")
    named_context: dict[str, Any] | None = Field(
        default=None,
        description="The named features the request sent (`context` is their hashed "
        "vector); null for a dense context",
    )
    arm_features: dict[str, list[float]] | None = Field(
        default=None,
        description="Candidate arm id -> the features it was scored with, for the arms "
        "the request gave its own; null when all had the catalogue's",
    )

    @classmethod
    def of(cls, record: LoggedDecision) -> DecisionRecord:
        """The API view of a record."""
        return cls(
            event_id=record.event_id,
            created_at=record.created_at,
            context=record.context,
            candidates=record.candidates,
            arm=record.arm_id,
            slot=record.slot,
            propensity=record.propensity,
            probabilities=record.probabilities,
            model_version=record.model_version,
            policy=record.policy,
            explore=record.explore,
            scores=record.scores,
            reward=record.reward,
            reward_received_at=record.reward_received_at,
            late=record.late,
            named_context=record.named_context,
            arm_features=record.arm_features,
        )


Moment = Annotated[
    str | None,
    Query(
        pattern=MOMENT_PATTERN,
        description="A date or time (ISO 8601; without an offset, UTC)",
        examples=["2026-11-25T12:00:00Z"],
    ),
]


@router.get("", response_model=list[DecisionRecord], responses=error_responses(422, 503))
async def decisions(
    sessions: SessionsDep,
    request: Request,
    response: Response,
    since: Moment = None,
    until: Moment = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="decisions per page")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=1024, description="from the `Link` header's next page")
    ] = None,
) -> list[DecisionRecord]:
    """Logged decisions with their rewards, oldest first, in `[since, until)`. When more
    follow, the `Link` header names the next page (`rel="next"`, RFC 8288)."""
    window = Window(
        None if since is None else parse_moment(since, "since"),
        None if until is None else parse_moment(until, "until"),
    )
    after = None if cursor is None else decode_cursor(cursor)
    page = await run_in_threadpool(read_page, sessions, window, after, limit + 1)
    if len(page) > limit:
        page = page[:limit]
        following = request.url.include_query_params(
            limit=limit, cursor=encode_cursor(page[-1].position)
        )
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return [DecisionRecord.of(record) for record in page]
