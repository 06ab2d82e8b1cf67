"""The trainer: a loop around the pure `models.fit`.

Each run, under the trainer lock (`rofu.service.db.trainer_lock`), reads the decisions whose
reward window has closed and that no checkpoint has consumed yet, refits theta_t from the
newest valid promoted checkpoint (damaged ones are quarantined on the way) on its data
sample plus the new rows, stores the new checkpoint durably in one transaction with the
claim on the consumed decisions, then publishes it; with the evaluation gate on, it stores
it as a candidate instead, and a later run publishes it only if it passes
(`rofu.service.lifecycle.gate`), deciding a pending candidate before it trains anything.
The claim fails, storing nothing, if another trainer consumed one of the rows or stored a
checkpoint since the run read them. A run with nothing to train on claims its rows and
stores no version. A run takes the preset's optimizer steps per new row
(`Settings.fit_config`), and with `fit_persist` continues its optimizer while it
continues the checkpoint it published last.

Reward-window rule: a decision is consumed once `reward_window_seconds` have passed since
it was made. If its reward arrived within the window it is trained on; if not, it is
trained on with `default_reward` when that is set, and otherwise excluded (consumed,
never trained on). A reward that arrives after the window closed, or after its decision
was consumed, is stored flagged `late` and never trained on (with a window of 0, only
the latter): what a checkpoint learns does not depend on when the trainer happened to
run. This keeps arms with slow feedback on an equal footing with fast ones. A deferred
decision (`"defer": true`) is trained on only if it was activated within the same window
(`rofu.service.rewards.activation`); otherwise it is consumed as expired, never trained on, whatever
its reward.

Every checkpoint records the feature hash seed its named features were hashed with;
one of another seed is refused (`rofu.service.deciding.snapshot.load_served`), as one of another
network is. An arm-feature network trains each row on the arm features it was decided
with, a request's own included (`rofu.service.lifecycle.training_data`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import torch

from rofu.models import Checkpoint, DataBuffer, FitConfig, RewardNet, dump_checkpoint, fit
from rofu.models.learners import LearnerFamily
from rofu.models.networks import parameters_finite
from rofu.models.rofu import ascent_rho
from rofu.models.scaling import scoring_inputs, squared_residuals
from rofu.service.db import deferral, quarantine, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.trainer_lock import TrainerLock, trainer_lock
from rofu.service.deciding.catalogue import CatalogueCache
from rofu.service.deciding.snapshot import HASH_SEED_KEY, load_served
from rofu.service.lifecycle import training_data
from rofu.service.lifecycle.bus import CheckpointBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.continuation import (
    KeptFamily,
    KeptNetwork,
    continued_family,
    continued_network,
    refit_family,
)
from rofu.service.lifecycle.gate import Gate, announce
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings

log = logging.getLogger("rofu.trainer")

#: rho past which gradient descent on the regulariser diverges (rofu.models.rofu_stability).
UNSTABLE_RHO = 2.0
MAX_ROWS_PER_RUN = 50_000


@dataclass(frozen=True)
class TrainReport:
    """What one training run did."""

    version: int
    consumed: int
    rewarded: int
    defaulted: int
    excluded: int
    loss: float | None  # None: nothing to train on, no checkpoint stored
    seconds: float
    expired: int = 0  # deferred decisions never activated in time: consumed, not trained on
    ascent_rho: float | None = None  # the checkpoint's rho (rofu.models.rofu_stability)
    status: str = "promoted"  # the evaluation gate's: candidate when it awaits it


@dataclass(frozen=True)
class _Run:
    """What one run read: its closed decisions, their targets and the checkpoints."""

    rows: list[repository.TrainingRow]
    trained: list[tuple[repository.TrainingRow, float]]  # (row, target) of those trained on
    newest: int  # the newest version stored, quarantined or not (0: none)
    parent: int  # the newest valid promoted checkpoint, which the run continues (0: none)
    started: float  # time.perf_counter()
    inactive: tuple[str, ...] = ()  # deferred decisions read before any activation in time

    @property
    def version(self) -> int:
        """The version this run stores: versions are never reused."""
        return self.newest + 1

    @property
    def unrewarded(self) -> list[str]:
        """The decisions read without a reward: one posted since is late."""
        return [row.event_id for row in self.rows if row.reward is None]


class Trainer:
    """Turns closed decisions into the next checkpoint, one trainer at a time."""

    def __init__(
        self,
        settings: Settings,
        sessions: SessionFactory,
        store: CheckpointStore,
        bus: CheckpointBus,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        lock: TrainerLock | None = None,
    ) -> None:
        self.settings = settings
        self._sessions = sessions
        self._store = store
        self._bus = bus
        self._metrics = metrics
        self._clock = clock
        self._lock = trainer_lock(sessions) if lock is None else lock
        self._catalogue = CatalogueCache(sessions, ttl_s=0.0)
        self._kept: KeptNetwork | None = None  # the optimizer fit_persist carries over
        self._kept_family: KeptFamily | None = None  # the learner family, likewise
        self._waiting = False  # another trainer held the lock at the last try
        self._gate = Gate(settings, sessions, store, self._announce, metrics, clock)

    def run_once(self) -> TrainReport | None:
        """One run under the trainer lock; None when no decision's window has closed since
        the last, when another trainer holds the lock, when another trainer claimed
        the rows first (then nothing was stored), or while a candidate awaits the gate."""
        with self._lock.hold() as held:
            if not held:
                if not self._waiting:
                    log.warning("another trainer holds the trainer lock; standing by")
                self._waiting = True
                self._skipped("locked")
                return None
            if self._waiting:
                log.info("took the trainer lock")
            self._waiting = False
            try:
                return self._run(time.perf_counter())
            except repository.ClaimLost as exc:
                log.warning("training run stored nothing: %s", exc)
                self._skipped("claim_lost")
                return None

    def _run(self, started: float) -> TrainReport | None:
        if not self._gate.settle():  # a candidate awaits the gate: its rows stay unconsumed
            return None
        window = timedelta(seconds=self.settings.reward_window_seconds)
        rows = repository.closed_decisions(self._sessions, self._clock() - window, MAX_ROWS_PER_RUN)
        if not rows:
            return None
        inactive = tuple(row.event_id for row in rows if not row.active)
        rows = [row for row in rows if row.active]
        newest = quarantine.newest_version(self._sessions)
        latest = self._store.latest()  # the newest valid promoted one; damaged: quarantined
        previous = None
        if latest is not None:
            previous = load_served(
                latest[1],
                self.settings.served_net_configs(),
                hash_seed=self.settings.feature_hash_seed,
            )
        used = [(row, self._target(row)) for row in rows]
        trained = [(row, target) for row, target in used if target is not None]
        parent = 0 if previous is None else previous.version
        run = _Run(rows, trained, newest, parent, started, inactive)
        if not trained:  # nothing new to learn from: consume the rows, store no version
            return self._consume_untrained(run)
        log.info(
            "training checkpoint %s on %s closed decisions (from checkpoint %s)",
            run.version,
            len(rows),
            run.parent,
        )
        features = self._arm_features()
        buffer = training_data.continued_buffer(self.settings, previous, run.version, features)
        new = training_data.transitions(trained, self.settings.context_dim, features)
        config = self.settings.fit_config(new_rows=len(trained))
        if self.settings.learners != ("mlp",):
            last, self._kept_family = self._kept_family, None
            family = continued_family(self.settings, previous, config, last)
            metrics = refit_family(family, buffer, new, self._generator(run.version), features)
            _check_finite(family.all_finite(), run.version)
            report = self._publish(family.served_net, buffer, features, metrics, run, family)
            steps0 = dataclasses.replace(config, steps=0)
            self._kept_family = KeptFamily(run.version, steps0, family)
            return report
        kept, self._kept = self._kept, None
        net, optimizer = continued_network(self.settings, previous, config, kept)
        # theta_{t-1} scores the new rows before it is refitted on them (the prequential noise)
        buffer.score_residuals(squared_residuals(net, new, features), config.prequential_decay)
        net.observe(new.x, new.rewards)  # a standardising network's running statistics
        buffer.append(new)
        metrics = self._fit(net, optimizer, config, buffer, run.version, features)
        report = self._publish(net, buffer, features, metrics, run)
        if optimizer is not None:
            steps0 = dataclasses.replace(config, steps=0)
            self._kept = KeptNetwork(run.version, net, optimizer, steps0)
        return report

    def _target(self, row: repository.TrainingRow) -> float | None:
        """The training target, or None to exclude the row (a holdout's; no reward and no
        default; values beyond the configured bounds, e.g. logged before a bound was lowered)."""
        target = row.reward if row.reward is not None else self.settings.default_reward
        if row.held_out or target is None or abs(target) > self.settings.max_abs_reward:
            return None
        own = row.arm_features
        if own is not None and len(own) != self.settings.arm_feature_dim:
            return None  # decided for an arm-feature network of another width
        bound = self.settings.max_abs_feature
        if any(abs(v) > bound for v in [*row.context, *(row.arm_features or ())]):
            return None
        return target

    def _arm_features(self) -> torch.Tensor | None:
        """The catalogue's (slots, F) arm features; None for a network with one output
        per arm."""
        if not self.settings.arm_feature_dim:
            return None
        return self._catalogue.refresh().feature_table(self.settings.arm_feature_dim)

    def _fit(
        self,
        net: RewardNet,
        optimizer: torch.optim.Optimizer | None,
        config: FitConfig,
        buffer: DataBuffer,
        version: int,
        features: torch.Tensor | None,
    ) -> dict[str, float]:
        generator = self._generator(version)
        metrics = fit(
            net, buffer.view(), config, generator, arm_features=features, optimizer=optimizer
        )
        _check_finite(parameters_finite(net), version)
        return metrics

    def _generator(self, version: int) -> torch.Generator:
        """The minibatch draws of the run that makes `version`."""
        return torch.Generator().manual_seed(self.settings.seed + 7919 * version)

    def _publish(
        self,
        net: RewardNet,
        buffer: DataBuffer,
        features: torch.Tensor | None,
        metrics: dict[str, float],
        run: _Run,
        family: LearnerFamily | None = None,
    ) -> TrainReport:
        n_slots = self.settings.max_arms if features is None else features.shape[0]
        data = buffer.regulariser_data(n_slots)
        config = dataclasses.replace(self.settings.rofu_config(), stability_cap=None)
        plain, plain_data, config, _ = scoring_inputs(net, data, config)
        rho = ascent_rho(plain, plain_data, config, arm_features=features)
        metrics = metrics | {"ascent_rho": rho}
        if data.noise is not None and data.noise.variance is not None:
            metrics |= {"noise_variance": data.noise.variance}
        checkpoint = Checkpoint(
            version=run.version,
            net_config=net.config,
            state={k: v.detach().cpu() for k, v in net.state_dict().items()},
            data=data,
            arm_features=features,
            metrics=metrics,
            extra={
                "created_at": str(time.time()),
                "parent_version": str(run.parent),
                "config": json.dumps(self.settings.model_config_record(), sort_keys=True),
                HASH_SEED_KEY: str(self.settings.feature_hash_seed),
            },
            candidates=() if family is None else family.states(),
            served_learner=None if family is None else family.served,
        )
        blob = dump_checkpoint(checkpoint)
        limit = self.settings.checkpoint_byte_limit()
        if len(blob) > limit:  # replicas would refuse it: store and publish nothing
            raise RuntimeError(
                f"checkpoint {run.version} is {len(blob)} bytes, over the limit of {limit} "
                "replicas read (ROFU_MAX_CHECKPOINT_BYTES); not stored"
            )
        status, figures = self._gate.initial(run.parent)
        self._store.save(
            run.version,
            blob,
            metrics=metrics,
            rows_trained=len(run.trained),
            n_total=data.n_total,
            consumed=[row.event_id for row in run.rows],
            newest=run.newest,
            parent=run.parent,
            unrewarded=run.unrewarded,
            status=status,
            gate=figures,
        )
        self._gate.stored(run.version, blob, status)
        report = self._report(run.version, run, metrics["loss"], self._expire(run, run.version))
        report = dataclasses.replace(report, ascent_rho=metrics["ascent_rho"], status=status)
        self._record(report)
        if family is not None and self._metrics is not None:
            losses = {c.name: family.losses[c.name].variance for c in family.candidates}
            self._metrics.record_learners(losses, family.served)
        return report

    def _announce(self, version: int, blob: bytes) -> None:
        announce(self._bus, self._metrics, version, blob)

    def _consume_untrained(self, run: _Run) -> TrainReport:
        """Claim rows that give nothing to train on (no reward, no default) for the parent:
        no new version is stored or published."""
        consumed = [row.event_id for row in run.rows]
        repository.mark_consumed(self._sessions, consumed, run.parent, run.unrewarded)
        report = self._report(run.parent, run, None, self._expire(run, run.parent))
        self._record(report)
        return report

    def _expire(self, run: _Run, version: int) -> int:
        """Consume the deferred decisions still not activated in time (never trained on);
        one activated since the run read it is left for the next run."""
        if not run.inactive:
            return 0
        return deferral.expire_unactivated(self._sessions, run.inactive, version)

    def _report(self, version: int, run: _Run, loss: float | None, expired: int) -> TrainReport:
        rewarded = sum(1 for row, _ in run.trained if row.reward is not None)
        return TrainReport(
            version=version,
            consumed=len(run.rows) + expired,
            rewarded=rewarded,
            defaulted=len(run.trained) - rewarded,
            excluded=len(run.rows) - len(run.trained),
            loss=loss,
            seconds=time.perf_counter() - run.started,
            expired=expired,
        )

    def _record(self, report: TrainReport) -> None:
        if report.loss is None:
            log.info(
                "training run: %s closed decisions consumed, none to train on (%s excluded); "
                "no new checkpoint",
                report.consumed,
                report.excluded,
            )
        else:
            log.info("training run: %s", report)
        rho = report.ascent_rho
        uncapped = self.settings.rofu_config().stability_cap is None
        if rho is not None and rho > UNSTABLE_RHO and uncapped:
            log.warning(
                "checkpoint %s: ROFU's ascent runs at rho = %.3g > %s, past which its steps "
                "diverge and its bonuses mean little (a lasting rise, not one spike from a few "
                "rare rows, is what matters); set ROFU_STABILITY_CAP=1 (or a smaller "
                "ROFU_STEP_SIZE)",
                report.version,
                rho,
                UNSTABLE_RHO,
            )
        if self._metrics is None:
            return
        m = self._metrics
        m.trainer_rows.labels("rewarded").inc(report.rewarded)
        m.trainer_rows.labels("default").inc(report.defaulted)
        m.trainer_rows.labels("excluded").inc(report.excluded)
        m.deferred.labels("expired").inc(report.expired)
        m.trainer_duration.observe(report.seconds)
        if report.ascent_rho is not None:
            m.trainer_ascent_rho.set(report.ascent_rho)
        if report.loss is not None:
            m.trainer_loss.set(report.loss)
        if report.loss is not None and report.status == "promoted":
            m.trainer_published.inc()

    def _skipped(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.trainer_skipped.labels(reason).inc()


def _check_finite(finite: bool, version: int) -> None:
    """Never publish a model that would score NaN."""
    if not finite:
        raise RuntimeError(
            f"training checkpoint {version} diverged (non-finite parameters); not published"
        )
