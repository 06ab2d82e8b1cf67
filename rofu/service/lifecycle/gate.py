"""The evaluation gate: a new checkpoint is a candidate until off-policy evaluation on
decisions it has never seen says it is not worse than the model it would replace.

With the gate on (`Settings.gate_on`), the trainer stores each new checkpoint as a
`candidate`, which no replica serves and nothing is published for. The candidate is
judged at a later trainer run, on the rows fresh for it (`rofu.service.log.fresh`): the
rewarded decisions made after it was stored, whose reward window has closed, which no
training of it consumed. The serving model made those decisions, so its figure is their
logged value (on-policy); the candidate's is its DR estimate there, scored as a replica
would serve it (`rofu.service.log.off_policy`). Once at least `gate_min_rows` such rows
exist (the newest `gate_window` are used), the candidate is promoted, and published,
when its DR lower bound is at least the serving value minus `gate_tolerance`; else it
is rejected, kept with its figures. A bad batch of rewards in the candidate's training
therefore never reaches the rows that judge it. Until the candidate is decided the
trainer trains nothing new: the closed decisions wait, unconsumed, for the next run.

The first checkpoint (nothing served: the cold start) is promoted without a judgment,
and says so in its figures. The rows a rejected candidate consumed stay consumed by it
and are never trained on again: its batch is the likeliest cause of its rejection.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from rofu.models import CheckpointError
from rofu.service.db import gate_status
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import CANDIDATE, PROMOTED, REJECTED, CheckpointRow
from rofu.service.lifecycle.bus import CheckpointBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.log.fresh import fresh_rows
from rofu.service.log.off_policy import (
    Interval,
    dr_value,
    mean_interval,
    ridge_rewards,
    rule_probabilities,
)
from rofu.service.log.pages import Window
from rofu.service.log.service_log import (
    EvaluationError,
    load_stored,
    read_service_log,
    score_checkpoint,
)
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings

log = logging.getLogger("rofu.gate")
FIRST = "the first checkpoint: no model is served to compare it with"


@dataclass(frozen=True)
class Judgment:
    """A candidate's DR and the serving model's logged value on the same fresh rows."""

    candidate: Interval
    serving: Interval
    tolerance: float

    @property
    def promote(self) -> bool:
        """The rule: the candidate's lower bound is not below serving - tolerance."""
        return self.candidate.low >= self.serving.value - self.tolerance

    def figures(self, at: datetime) -> dict[str, Any]:
        """The record stored in `checkpoints.gate`."""
        c, s = self.candidate, self.serving
        verdict = "not below" if self.promote else "below"
        reason = (
            f"DR lower bound {c.low:.4g} {verdict} the serving model's logged value "
            f"{s.value:.4g} - tolerance {self.tolerance:g} on {c.rows} fresh rows"
        )
        return {
            "candidate": _finite(asdict(c)),
            "serving": _finite(asdict(s)),
            "rows": c.rows,
            "tolerance": self.tolerance,
            "reason": reason,
            "at": at.isoformat(),
            "by": "gate",
        }


def judge(
    settings: Settings, sessions: SessionFactory, version: int, closed_before: datetime
) -> Judgment | int:
    """Judge candidate `version` on its fresh rows decided before `closed_before`; the
    number of those rows instead while they are fewer than `gate_min_rows`.

    Raises:
        EvaluationError: the candidate cannot be loaded or scored under the settings.
    """
    stored = load_stored(settings, sessions, version)
    try:
        window = Window(since=stored.created_at, until=closed_before)
        rewarded = read_service_log(sessions, window, settings.default_reward)
    except EvaluationError:
        return 0  # no rewarded decision yet
    # the serving model's own decisions: a holdout's were served by its control
    index = np.flatnonzero(fresh_rows(rewarded, version, stored.created_at) & ~rewarded.held_out)
    index = index[-settings.gate_window :]
    if len(index) < settings.gate_min_rows:
        return int(len(index))
    rows = rewarded.subset(index)
    config = settings.rofu_config()
    scores = score_checkpoint(settings, stored, rows, config)
    probabilities = rule_probabilities(scores, rows, config.rule)
    q = ridge_rewards(rows, seed=settings.seed)
    candidate = dr_value(probabilities, rows, q, seed=settings.seed + version)
    return Judgment(candidate, mean_interval(rows.rewards), settings.gate_tolerance)


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: Postgres's JSON refuses NaN."""
    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()
    }


class Gate:
    """The trainer's side of the gate: what a new checkpoint is stored as, and deciding
    the pending candidate (one at a time, under the trainer lock)."""

    def __init__(
        self,
        settings: Settings,
        sessions: SessionFactory,
        store: CheckpointStore,
        publish: Callable[[int, bytes], None],
        metrics: ServiceMetrics | None,
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self._sessions = sessions
        self._store = store
        self._publish = publish  # the trainer's bus, read at each call (`announce`)
        self._metrics = metrics
        self._clock = clock

    def initial(self, parent: int) -> tuple[str, dict[str, Any] | None]:
        """(status, figures) of a new checkpoint continuing `parent` (0: none served)."""
        if not self.settings.gate_on:
            return PROMOTED, None
        if parent == 0:
            return PROMOTED, {"reason": FIRST, "at": self._clock().isoformat(), "by": "gate"}
        return CANDIDATE, None

    def stored(self, version: int, blob: bytes, status: str) -> None:
        """After a checkpoint is stored: publish it if promoted, else await the gate."""
        if status == PROMOTED:
            self._publish(version, blob)
            return
        log.info(
            "checkpoint %s stored as a candidate: not served until the gate judges it on %s "
            "rewarded decisions made after it",
            version,
            self.settings.gate_min_rows,
        )
        if self._metrics is not None:
            self._metrics.gate_candidate.set(version)

    def settle(self) -> bool:
        """Decide the pending candidate, if any; False while it stays pending (the run
        must then store nothing: no candidate is stacked on another)."""
        row = gate_status.pending(self._sessions)
        if row is None:
            self._pending(0)
            return True
        window = timedelta(seconds=self.settings.reward_window_seconds)
        try:
            found = judge(self.settings, self._sessions, row.version, self._clock() - window)
        except EvaluationError as exc:  # it would be refused by the replicas too
            figures = {"reason": f"cannot be evaluated: {exc}", "by": "gate"}
            self._decide(row, REJECTED, figures | {"at": self._clock().isoformat()})
            return True
        if isinstance(found, int):
            log.info(
                "candidate checkpoint %s: %s of the %s fresh rewarded decisions the gate "
                "needs; training waits",
                row.version,
                found,
                self.settings.gate_min_rows,
            )
            self._pending(row.version)
            return False
        status = PROMOTED if found.promote else REJECTED
        self._decide(row, status, found.figures(self._clock()))
        return True

    def _decide(self, row: CheckpointRow, status: str, figures: dict[str, Any]) -> None:
        if not gate_status.mark(self._sessions, row.version, status, figures, was=CANDIDATE):
            return  # an operator decided it meanwhile
        log_at = log.info if status == PROMOTED else log.warning
        log_at("candidate checkpoint %s %s: %s", row.version, status, figures["reason"])
        if self._metrics is not None:
            self._metrics.gate_decisions.labels(status).inc()
        self._pending(0)
        if status != PROMOTED:
            return
        try:
            stored = self._store.get(row.version)
        except CheckpointError as exc:  # replicas find the promotion at their next poll
            log.warning("promoted checkpoint %s not published: %s", row.version, exc)
            return
        if stored is not None:
            self._publish(row.version, stored[1])

    def _pending(self, version: int) -> None:
        if self._metrics is not None:
            self._metrics.gate_candidate.set(version)


def announce(bus: CheckpointBus, metrics: ServiceMetrics | None, version: int, blob: bytes) -> None:
    """Publish a stored, promoted checkpoint; a failure is counted, not fatal (it is
    durable: replicas poll for it)."""
    try:
        bus.publish(version, blob)
    except Exception as exc:  # e.g. Redis down: a line per run, no traceback
        log.warning(
            "publishing checkpoint %s failed (%s: %s); replicas will poll for it",
            version,
            type(exc).__name__,
            exc,
        )
        if metrics is not None:
            metrics.trainer_publish_failures.inc()
