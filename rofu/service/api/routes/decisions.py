"""GET /decisions: the decision log with rewards, a page at a time (admin); deferred
decisions not activated in time are listed, marked `active: false`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from rofu.client.records import DecisionRecord
from rofu.service.api.decoding import JsonRoute
from rofu.service.api.deps import AdminAuth, SessionsDep
from rofu.service.api.routes import API_PREFIX
from rofu.service.api.schemas import error_responses
from rofu.service.log.pages import (
    MOMENT_PATTERN,
    Window,
    decode_cursor,
    encode_cursor,
    parse_moment,
    position,
    read_page,
)

MAX_PAGE = 1000
router = APIRouter(
    route_class=JsonRoute,
    prefix=f"{API_PREFIX}/decisions",
    tags=["decisions"],
    dependencies=[AdminAuth],
    responses=error_responses(401, 403),
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
            limit=limit, cursor=encode_cursor(position(page[-1]))
        )
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return page
