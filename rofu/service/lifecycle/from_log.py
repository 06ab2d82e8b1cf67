"""`rofu train --from-log [--holdout FRACTION]`: checkpoints from the stored log (an
imported one: `rofu import`), by the service's own trainer (`Trainer.run_once`).

The log is historical, so the reward window is not waited for: every decision not yet
consumed is trained on (runs of at most `MAX_ROWS_PER_RUN` rows, each continuing the
checkpoint before it, as the trainer's loop does; a second `rofu train --from-log`
continues from the newest checkpoint). With `holdout`, the newest FRACTION (by decision
time) of the unconsumed rewarded, active decisions are left unconsumed, with everything
decided after the last one trained on, so that `rofu evaluate` estimates the new
checkpoint on decisions it never saw (`rofu.evaluation.fresh`). Decisions that share the
cut-off's timestamp are trained on.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from sqlalchemy import and_, select

from rofu.service import migrate
from rofu.service.db.engine import MissingDatabase, SessionFactory, session_factory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import DecisionRow, RewardRow, is_active
from rofu.service.errors import ServiceError
from rofu.service.lifecycle.bus import CheckpointBus, NullBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.trainer import Trainer, TrainReport
from rofu.service.settings import Settings


class NothingToTrain(ValueError):
    """No decision to train on (or the holdout would keep them all)."""


def cutoff(sessions: SessionFactory, holdout: float) -> tuple[datetime, int]:
    """(the newest decision time to train on, how many rewarded rows that leaves out: fewer
    than the fraction asks when decisions share the cut-off's timestamp).

    Raises:
        NothingToTrain: no unconsumed rewarded, active decision, or the holdout keeps all.
    """
    on_time = and_(RewardRow.event_id == DecisionRow.event_id, RewardRow.late.is_(False))
    query = (
        select(
            DecisionRow.created_at,
            DecisionRow.deferred,
            DecisionRow.activated_at,
            DecisionRow.activation_late,
        )
        .join(RewardRow, on_time)
        .where(DecisionRow.trained_in.is_(None))
        .order_by(DecisionRow.created_at, DecisionRow.event_id)
    )
    with database_errors(), sessions() as session, session.begin():
        times = [row[0] for row in session.execute(query) if is_active(*row[1:])]
    held = round(holdout * len(times))
    if len(times) - held < 1:
        raise NothingToTrain(
            f"{len(times)} unconsumed rewarded decisions"
            + (f", all held out by --holdout {holdout:g}" if times else "")
        )
    if not held:
        return datetime.now(UTC), 0
    until = times[-held - 1]
    return until, sum(time > until for time in times)  # ties with the cut-off are trained on


def train_from_log(settings: Settings, holdout: float = 0.0) -> tuple[list[TrainReport], int]:
    """Train on the stored log until no unconsumed decision before the cut-off is left.

    Returns:
        (one report per run, how many rewarded decisions were held out)

    Raises:
        MissingDatabase: no migrated database at `ROFU_DATABASE_URL`.
        NothingToTrain: see `cutoff`.
    """
    engine = migrate.migrated_engine(settings.database_url)
    redis = None if settings.redis_url is None else RedisBus.of(settings)
    bus: CheckpointBus = NullBus() if redis is None else redis
    try:
        sessions = session_factory(engine)
        until, held = cutoff(sessions, holdout)
        historical = settings.model_copy(update={"reward_window_seconds": 0.0})
        store = CheckpointStore(
            sessions, settings.checkpoint_dir, max_bytes=settings.checkpoint_byte_limit()
        )
        trainer = Trainer(historical, sessions, store, bus, clock=lambda: until)
        reports = []
        while (report := trainer.run_once()) is not None:
            reports.append(report)
        return reports, held
    finally:
        engine.dispose()
        if redis is not None:
            redis.close()


def run(settings: Settings, args: argparse.Namespace) -> int:
    """`rofu train` with parsed arguments: 0 trained, 1 nothing trained, 2 usage error."""
    if not args.from_log:
        print("rofu train: say what to train on: --from-log (the stored log)", file=sys.stderr)
        return 2
    try:
        reports, held = train_from_log(settings, args.holdout)
    except MissingDatabase as exc:
        print(f"rofu train: {exc}", file=sys.stderr)
        return 2
    except (NothingToTrain, ServiceError, RuntimeError) as exc:
        print(f"rofu train: nothing trained: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        print(f"rofu train: {_line(report)}")
    stored = [report for report in reports if report.loss is not None]
    if not stored:
        print(
            "rofu train: no checkpoint stored: no decision to train on (or another trainer "
            "holds the trainer lock)",
            file=sys.stderr,
        )
        return 1
    print(f"rofu train: checkpoint v{stored[-1].version}; {held} rewarded decisions held out")
    return 0


def _line(report: TrainReport) -> str:
    if report.loss is None:
        return (
            f"consumed {report.consumed} decisions, none to train on ({report.excluded} excluded)"
        )
    return (
        f"checkpoint v{report.version}: trained on {report.rewarded + report.defaulted} of "
        f"{report.consumed} decisions ({report.excluded} excluded, {report.expired} expired), "
        f"loss {report.loss:.4g}"
    )
