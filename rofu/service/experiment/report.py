"""GET /v1/report: rofu against its holdout, from the decision log.

It reads every decision made while a holdout ran (`decisions.experiment` set; from
`since` on when given) with its reward, in one streamed query, and folds them into
per-unit sums, so its memory grows with the units (the decisions themselves where
requests send no `unit_id`), not with each unit's decisions. A decision's
outcome is its reward (a late one too: it is a real outcome, only kept from training),
else `ROFU_DEFAULT_REWARD` once its reward window has closed, when that is set; a
deferred decision never activated in time has none (the app did not show it), in either
group. Guardrail metrics are the `metrics` apps sent with rewards, each compared on the
units that reported it. The statistics are `rofu.service.experiment.stats`.

The assignment is only as good as its configuration: after changing the share or the
salt, read the report `since` the change (the sample-ratio check flags a mix).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from rofu.client import experiment as wire
from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import transaction
from rofu.service.db.tables import HOLDOUT, DecisionRow, RewardRow, is_active, utcnow
from rofu.service.deciding.holdout import ROFU_GROUP
from rofu.service.experiment.stats import Comparison, Interval, compare, sample_ratio
from rofu.service.settings import Settings

GROUPS = (ROFU_GROUP, HOLDOUT)
STREAM_ROWS = 5_000


@dataclass
class _Unit:
    """One unit's running sums: per outcome (the reward, or a metric), (sum, count)."""

    sums: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))

    def add(self, outcome: str, value: float) -> None:
        entry = self.sums[outcome]
        entry[0] += value
        entry[1] += 1

    def mean(self, outcome: str) -> float | None:
        entry = self.sums.get(outcome)
        return None if entry is None else entry[0] / entry[1]


@dataclass
class _Group:
    decisions: int = 0
    rewarded: int = 0
    units: dict[str, _Unit] = field(default_factory=lambda: defaultdict(_Unit))

    def values(self, outcome: str) -> list[float]:
        means = (unit.mean(outcome) for unit in self.units.values())
        return [m for m in means if m is not None]


REWARD = ""  # the reward's key among a unit's outcomes (metric names are never empty)


def holdout_report(
    sessions: SessionFactory, settings: Settings, since: datetime | None = None
) -> wire.ReportResponse:
    """rofu against the holdout on the decisions logged while it ran (from `since`)."""
    groups, span = transaction(sessions, lambda session: _read(session, settings, since))
    rofu, holdout = groups[ROFU_GROUP], groups[HOLDOUT]
    metrics = sorted({name for g in (rofu, holdout) for u in g.units.values() for name in u.sums})
    guardrails = {
        name: _comparison(compare(rofu.values(name), holdout.values(name)))
        for name in metrics
        if name != REWARD
    }
    ratio = sample_ratio(len(rofu.units), len(holdout.units), settings.holdout_share)
    report = wire.ReportResponse(
        holdout_share=settings.holdout_share,
        salt=settings.holdout_salt,
        since=since,
        first_decision=span[0],
        last_decision=span[1],
        groups={
            name: wire.GroupCounts(
                decisions=group.decisions, units=len(group.units), rewarded=group.rewarded
            )
            for name, group in groups.items()
        },
        reward=_comparison(compare(rofu.values(REWARD), holdout.values(REWARD))),
        guardrails=guardrails,
        sample_ratio=wire.SampleRatio(**asdict(ratio), mismatch=ratio.mismatch),
    )
    report.warnings.extend(_warnings(report, settings))
    return report


def _read(
    session: Session, settings: Settings, since: datetime | None
) -> tuple[dict[str, _Group], tuple[datetime | None, datetime | None]]:
    """Per group, the units' running sums, and the first and last decision's time."""
    groups = {name: _Group() for name in GROUPS}
    query = (
        select(
            DecisionRow.experiment,
            DecisionRow.unit_id,
            DecisionRow.event_id,
            DecisionRow.created_at,
            DecisionRow.deferred,
            DecisionRow.activated_at,
            DecisionRow.activation_late,
            RewardRow.value,
            RewardRow.metrics,
        )
        .outerjoin(RewardRow, RewardRow.event_id == DecisionRow.event_id)
        .where(DecisionRow.experiment.in_(GROUPS))
        .execution_options(yield_per=STREAM_ROWS)
    )
    if since is not None:
        query = query.where(DecisionRow.created_at >= since)
    closed = utcnow() - timedelta(seconds=settings.reward_window_seconds)
    first: datetime | None = None
    last: datetime | None = None
    for row in session.execute(query):
        group = groups[row.experiment]
        group.decisions += 1
        unit = group.units[row.unit_id if row.unit_id is not None else row.event_id]
        first = row.created_at if first is None else min(first, row.created_at)
        last = row.created_at if last is None else max(last, row.created_at)
        if not is_active(row.deferred, row.activated_at, row.activation_late):
            continue
        if row.value is not None:
            group.rewarded += 1
            unit.add(REWARD, row.value)
            for name, value in (row.metrics or {}).items():
                unit.add(name, float(value))
        elif settings.default_reward is not None and row.created_at <= closed:
            unit.add(REWARD, settings.default_reward)
    return groups, (first, last)


def _interval(value: Interval) -> wire.Interval:
    return wire.Interval(estimate=value.estimate, low=value.low, high=value.high)


def _comparison(result: Comparison) -> wire.Comparison:
    return wire.Comparison(
        rofu=wire.Group(units=result.rofu.units, mean=_interval(result.rofu.mean)),
        holdout=wire.Group(units=result.holdout.units, mean=_interval(result.holdout.mean)),
        difference=_interval(result.difference),
        lift=_interval(result.lift),
        sequential=_interval(result.sequence),
        p_value=result.p_value,
        significant=result.significant,
    )


def _warnings(report: wire.ReportResponse, settings: Settings) -> list[str]:
    """What a reader must know before trusting the figures."""
    notes = []
    if settings.holdout_share == 0:
        notes.append("no holdout runs now (ROFU_HOLDOUT_SHARE=0): these are past decisions")
    if report.sample_ratio.mismatch:
        observed = report.sample_ratio.observed_holdout_share
        notes.append(
            f"sample-ratio mismatch: {observed:.4f} of the units are in the holdout, "
            f"{settings.holdout_share:g} expected (p = {report.sample_ratio.p_value:.2g}); "
            "a changed share or salt, lost decisions or bots: do not trust the comparison"
        )
    if report.reward.p_value is None:
        notes.append("too few rewarded units in a group to compare (at least 2 each)")
    return notes
