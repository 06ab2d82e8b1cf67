"""The decision log as records: each decision joined with its reward, read in pages.

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
from typing import Any

from sqlalchemy import and_, or_, select

from rofu.models.scores import ArmScore
from rofu.service.api.schemas import EVENT_ID_PATTERN
from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import DecisionRow, RewardRow, is_active
from rofu.service.deciding.apprentice import APPRENTICE
from rofu.service.deciding.select import stored_scores
from rofu.service.errors import InvalidInput

COLD_START = "cold-start"
Position = tuple[datetime, str]  # (created_at, event_id) of a page's last record


@dataclass(frozen=True)
class Window:
    """Decisions made at `since` or later and before `until` (either end open when None)."""

    since: datetime | None = None
    until: datetime | None = None


#: The whole log.
EVERYTHING = Window()


@dataclass(frozen=True)
class LoggedDecision:
    """One logged decision and what came of it.

    Attributes:
        probabilities: per candidate, in `candidates` order, the probability with which
            the service's rule picked it; None when only `propensity` is known (rows
            logged before probabilities were stored, unless they are implied: a cold
            start is uniform, a propensity of 1 leaves the others 0).
        reward: the stored reward, None when none arrived.
        late: whether the reward came after the decision's window (None: not recorded).
        baseline_arm: the app's own choice the request carried (None: none).
        rofu_arm, rofu_probabilities: in apprentice mode, which served the baseline, what
            rofu's rule would have chosen and its probabilities (None otherwise).
        deferred: logged with `defer`: trained on and evaluated only once activated.
        activated_at: a deferred decision's first activation (None: never activated).
        activation_late: the activation came after the window or after the trainer
            consumed the decision.
        named_context: the named features the request sent, as validated (`context` is
            their hashed vector); None for a dense context.
        arm_features: candidate arm id -> the features it was scored with, for the
            candidates the request gave its own (the others had the catalogue's).
    """

    event_id: str
    created_at: datetime
    context: list[float]
    candidates: list[str]
    arm_id: str
    slot: int
    propensity: float
    probabilities: list[float] | None
    model_version: int
    policy: str
    explore: bool
    scores: list[ArmScore]
    reward: float | None
    reward_received_at: datetime | None
    late: bool | None
    baseline_arm: str | None = None
    rofu_arm: str | None = None
    rofu_probabilities: list[float] | None = None
    deferred: bool = False
    activated_at: datetime | None = None
    activation_late: bool = False
    named_context: dict[str, Any] | None = None
    arm_features: dict[str, list[float]] | None = None

    @property
    def rule_probabilities(self) -> list[float] | None:
        """Rofu's own rule's probabilities per candidate: those it served by, or in
        apprentice mode those it would have (None where not logged)."""
        if self.policy == APPRENTICE:
            return self.rofu_probabilities
        return self.probabilities

    @property
    def active(self) -> bool:
        """Whether the decision counts (training, evaluation, OBP rounds): not deferred,
        or activated in time. DSJSON marks the others `_skipLearn`."""
        return is_active(self.deferred, self.activated_at, self.activation_late)

    @property
    def chosen_index(self) -> int:
        """The chosen arm's position among the candidates."""
        return self.candidates.index(self.arm_id)

    @property
    def position(self) -> Position:
        """This record's place in the log's order."""
        return self.created_at, self.event_id


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
) -> list[LoggedDecision]:
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
        return [record(d, r) for d, r in session.execute(query)]


def iter_decisions(
    sessions: SessionFactory, window: Window = EVERYTHING, *, page_size: int = 1000
) -> Iterator[LoggedDecision]:
    """Every record of the window in log order, one page in memory at a time."""
    after: Position | None = None
    while True:
        page = read_page(sessions, window, after, page_size)
        yield from page
        if len(page) < page_size:
            return
        after = page[-1].position


def record(decision: DecisionRow, reward: RewardRow | None) -> LoggedDecision:
    """The record of a decision row and its reward row."""
    return LoggedDecision(
        event_id=decision.event_id,
        created_at=decision.created_at,
        context=[float(v) for v in decision.context],
        candidates=list(decision.candidates),
        arm_id=decision.arm_id,
        slot=decision.slot,
        propensity=decision.propensity,
        probabilities=_probabilities(decision),
        model_version=decision.model_version,
        policy=decision.policy,
        explore=decision.explore,
        scores=stored_scores(decision),
        reward=None if reward is None else reward.value,
        reward_received_at=None if reward is None else reward.received_at,
        late=None if reward is None else _optional_bool(getattr(reward, "late", None)),
        baseline_arm=decision.baseline_arm,
        rofu_arm=decision.rofu_arm,
        rofu_probabilities=None
        if decision.rofu_probabilities is None
        else [float(p) for p in decision.rofu_probabilities],
        deferred=decision.deferred,
        activated_at=decision.activated_at,
        activation_late=decision.activation_late,
        named_context=decision.named_context,
        arm_features=decision.arm_features,
    )


def _probabilities(decision: DecisionRow) -> list[float] | None:
    # The column arrives with migration 0004; older rows (and databases) lack it.
    logged: Any = getattr(decision, "probabilities", None)
    if logged is not None:
        return [float(p) for p in logged]
    k = len(decision.candidates)
    if decision.policy == COLD_START:
        return [1.0 / k] * k
    if decision.propensity >= 1.0:
        return [float(arm == decision.arm_id) for arm in decision.candidates]
    return None


def _optional_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


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
