"""The decision log as records (`DecisionRecord`): each decision joined with its reward,
read in pages.

Pages follow the key (created_at, event_id): each page is one short query starting after
the last record of the one before, so a reader of any size holds one page at a time and
rows logged meanwhile never shift a page. `rofu export` and `GET /v1/decisions` read
through here, and so does `rofu evaluate`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, or_, select

from rofu.client.records import DecisionRecord
from rofu.client.schemas import EVENT_ID_PATTERN
from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import DecisionRow, RewardRow
from rofu.service.errors import InvalidInput
from rofu.service.log.record import decision_record

Position = tuple[datetime, str]  # (created_at, event_id) of a page's last record


@dataclass(frozen=True)
class Window:
    """Decisions made at `since` or later and before `until` (either end open when None)."""

    since: datetime | None = None
    until: datetime | None = None


#: The whole log.
EVERYTHING = Window()


def position(record: DecisionRecord) -> Position:
    """A record's place in the log's order."""
    return record.created_at, record.event_id


def utc(moment: datetime, field: str = "since") -> datetime:
    """`moment` in UTC; a naive one is taken to be UTC already.

    Raises:
        InvalidInput: the moment cannot be expressed in UTC (e.g. year 1 with an offset).
    """
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidInput(f"{field}: {moment.isoformat()} is out of range", field=field) from exc


#: The moments the API takes: a date, optionally a time, optionally an offset (else UTC).
MOMENT_PATTERN = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?$"


def parse_moment(text: str, field: str) -> datetime:
    """A moment of `MOMENT_PATTERN` in UTC.

    Raises:
        InvalidInput: not such a moment (e.g. month 13), naming `field`.
    """
    try:
        moment = datetime.fromisoformat(text) if re.fullmatch(MOMENT_PATTERN, text) else None
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidInput(
            f"{field}: {text!r} is not a date or time like 2026-11-25 or 2026-11-25T12:00:00Z",
            field=field,
        )
    return utc(moment, field)


def read_page(
    sessions: SessionFactory, window: Window, after: Position | None, limit: int
) -> list[DecisionRecord]:
    """Up to `limit` records of the window after `after`, in log order (one query)."""
    query = (
        select(DecisionRow, RewardRow)
        .outerjoin(RewardRow, RewardRow.event_id == DecisionRow.event_id)
        .order_by(DecisionRow.created_at, DecisionRow.event_id)
        .limit(limit)
    )
    if window.since is not None:
        query = query.where(DecisionRow.created_at >= window.since)
    if window.until is not None:
        query = query.where(DecisionRow.created_at < window.until)
    if after is not None:
        at, event_id = after
        query = query.where(
            or_(
                DecisionRow.created_at > at,
                and_(DecisionRow.created_at == at, DecisionRow.event_id > event_id),
            )
        )

    with database_errors(), sessions() as session, session.begin():
        return [decision_record(d, r) for d, r in session.execute(query)]


def iter_decisions(
    sessions: SessionFactory, window: Window = EVERYTHING, *, page_size: int = 1000
) -> Iterator[DecisionRecord]:
    """Every record of the window in log order, one page in memory at a time."""
    after: Position | None = None
    while True:
        page = read_page(sessions, window, after, page_size)
        yield from page
        if len(page) < page_size:
            return
        after = position(page[-1])


# Cursors: an opaque token for the position after which the next page starts --------------


def encode_cursor(position: Position) -> str:
    """The opaque cursor of a position."""
    raw = json.dumps([position[0].isoformat(), position[1]], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    """The position a cursor names.

    Raises:
        InvalidInput: the cursor was not issued by `encode_cursor`.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, event_id = json.loads(raw)
        if not isinstance(at, str) or not isinstance(event_id, str):
            raise ValueError("not a position")
        if not re.fullmatch(EVENT_ID_PATTERN, event_id):
            raise ValueError("not an event id")
        return utc(datetime.fromisoformat(at), "cursor"), event_id
    except (binascii.Error, ValueError, TypeError, InvalidInput) as exc:
        raise InvalidInput(
            "cursor: not a cursor from this endpoint's Link header", field="cursor"
        ) from exc
