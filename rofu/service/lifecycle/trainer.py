"""The trainer: a loop around the pure `models.fit`.

Each run, under the trainer lock (`rofu.service.db.trainer_lock`), reads the decisions whose
reward window has closed and that no checkpoint has consumed yet, refits theta_t from the
newest valid checkpoint (damaged ones are quarantined on the way) on its data sample plus
the new rows, stores the new checkpoint durably in one transaction with the claim on the
consumed decisions, then publishes it. The claim fails, storing nothing, if another
trainer consumed one of the rows or stored a checkpoint since the run read them. A run
with nothing to train on claims its rows and stores no version. A run takes the preset's
optimizer steps per new row (`Settings.fit_config`), and with `fit_persist` continues its
optimizer while it continues the checkpoint it published last.

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
from rofu.models.checkpoint import CandidateState
from rofu.models.data import Prequential, Transitions
from rofu.models.learners import LearnerFamily, candidates
from rofu.models.rofu import ascent_rho
from rofu.models.scaling import scoring_inputs, squared_residuals
from rofu.models.training import make_optimizer
from rofu.service.db import deferral, quarantine, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.trainer_lock import TrainerLock, trainer_lock
from rofu.service.deciding.catalogue import CatalogueCache
from rofu.service.deciding.snapshot import HASH_SEED_KEY, load_served
from rofu.service.lifecycle import training_data
from rofu.service.lifecycle.bus import CheckpointBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings

log = logging.getLogger("rofu.trainer")

#: rho past which gradient descent on the regulariser diverges (rofu.models.rofu_stability).
UNSTABLE_RHO = 2.0
MAX_ROWS_PER_RUN = 50_000


@dataclass(frozen=True)
class _Kept:
    """The network and optimizer of the checkpoint this trainer published last."""

    version: int
    net: RewardNet
    optimizer: torch.optim.Optimizer
    config: FitConfig  # its FitConfig, steps aside: another one starts a fresh optimizer


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


@dataclass(frozen=True)
class _Run:
    """What one run read: its closed decisions, their targets and the checkpoints."""

    rows: list[repository.TrainingRow]
    trained: list[tuple[repository.TrainingRow, float]]  # (row, target) of those trained on
    newest: int  # the newest version stored, quarantined or not (0: none)
    parent: int  # the newest valid checkpoint, which the run continues (0: none)
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
        self._kept: _Kept | None = None  # the optimizer fit_persist carries over
        # (version, its FitConfig steps aside, the family) of the last checkpoint published
        self._kept_family: tuple[int, FitConfig, LearnerFamily] | None = None
        self._waiting = False  # another trainer held the lock at the last try

    def run_once(self) -> TrainReport | None:
        """One run under the trainer lock; None when no decision's window has closed since
        the last, when another trainer holds the lock, or when another trainer claimed
        the rows first (then nothing was stored)."""
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
        window = timedelta(seconds=self.settings.reward_window_seconds)
        rows = repository.closed_decisions(self._sessions, self._clock() - window, MAX_ROWS_PER_RUN)
        if not rows:
            return None
        inactive = tuple(row.event_id for row in rows if not row.active)
        rows = [row for row in rows if row.active]
        newest = quarantine.newest_version(self._sessions)
        latest = self._store.latest()  # the newest valid one; damaged ones are quarantined
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
            family = self._family(previous, config)
            net, metrics = self._fit_family(family, buffer, new, run.version, features)
            report = self._publish(net, buffer, features, metrics, run, family)
            self._kept_family = (run.version, dataclasses.replace(config, steps=0), family)
            return report
        net, optimizer = self._continue(previous, config)
        # theta_{t-1} scores the new rows before it is refitted on them (the prequential noise)
        buffer.score_residuals(squared_residuals(net, new, features), config.prequential_decay)
        net.observe(new.x, new.rewards)  # a standardising network's running statistics
        buffer.append(new)
        metrics = self._fit(net, optimizer, config, buffer, run.version, features)
        report = self._publish(net, buffer, features, metrics, run)
        if optimizer is not None:
            self._kept = _Kept(run.version, net, optimizer, dataclasses.replace(config, steps=0))
        return report

    def _family(self, previous: Checkpoint | None, config: FitConfig) -> LearnerFamily:
        """The candidate learners to refit: the family in memory while this process
        continues the checkpoint it published last (with fit_persist, their optimizers
        too), else one continuing the candidates the previous checkpoint kept. From a
        checkpoint without a family, `mlp` continues its network and its loss; a
        candidate it did not keep starts anew."""
        kept, self._kept_family = self._kept_family, None
        steps0 = dataclasses.replace(config, steps=0)
        if kept is not None and previous is not None and kept[:2] == (previous.version, steps0):
            family = kept[2]
        else:
            family = LearnerFamily(
                candidates(self.settings.learners, self.settings.net_config(), config),
                decay=config.prequential_decay,
                persist=self.settings.fit_persist,
            )
            if previous is not None:
                family.restore(previous.candidates or (_as_candidate(previous),))
        family.candidates = tuple(  # every candidate takes this run's steps
            dataclasses.replace(c, fit=dataclasses.replace(c.fit, steps=config.steps))
            for c in family.candidates
        )
        return family

    def _fit_family(
        self,
        family: LearnerFamily,
        buffer: DataBuffer,
        new: Transitions,
        version: int,
        features: torch.Tensor | None,
    ) -> tuple[RewardNet, dict[str, float]]:
        """Every candidate scores the new rows, then is refitted on the buffer with them;
        the served candidate's loss is the buffer's prequential noise."""
        family.observe(new, features)
        buffer.noise = family.losses[family.served]
        buffer.append(new)
        generator = torch.Generator().manual_seed(self.settings.seed + 7919 * version)
        metrics = family.fit(buffer.view(), generator, features)
        if not family.all_finite():
            raise RuntimeError(  # never publish a model that would score NaN
                f"training checkpoint {version} diverged (non-finite parameters); not published"
            )
        return family.served_net, metrics

    def _target(self, row: repository.TrainingRow) -> float | None:
        """The training target, or None to exclude the row (no reward and no default, or
        values beyond the configured bounds, e.g. logged before a bound was lowered)."""
        target = row.reward if row.reward is not None else self.settings.default_reward
        if target is None or abs(target) > self.settings.max_abs_reward:
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

    def _continue(
        self, previous: Checkpoint | None, config: FitConfig
    ) -> tuple[RewardNet, torch.optim.Optimizer | None]:
        """The network to refit and, with fit_persist, the optimizer it continues.

        The optimizer carries over while this process continues from the checkpoint it
        published last (its network is that checkpoint's, in memory); after a restart, a
        failed run or another trainer's checkpoint a fresh one starts, as at the first.
        """
        kept, self._kept = self._kept, None
        if not self.settings.fit_persist:
            return self._network(previous, config), None
        if (
            kept is not None
            and previous is not None
            and kept.version == previous.version
            and kept.config == dataclasses.replace(config, steps=0)
        ):
            return kept.net, kept.optimizer
        net = self._network(previous, config)
        return net, make_optimizer(net, config)

    def _network(self, previous: Checkpoint | None, config: FitConfig) -> RewardNet:
        """The previous checkpoint's network (a fresh one without), standardising as
        `config.standardise` says: switching keeps the layers, and a newly standardising
        network starts its statistics at the new rows."""
        if previous is None:
            return RewardNet(
                dataclasses.replace(self.settings.net_config(), standardise=config.standardise)
            )
        net = previous.network()
        if net.config.standardise != config.standardise:
            switched = RewardNet(dataclasses.replace(net.config, standardise=config.standardise))
            layers = {k: v for k, v in net.state_dict().items() if k.startswith("layers.")}
            switched.load_state_dict(layers, strict=False)
            return switched
        return net

    def _fit(
        self,
        net: RewardNet,
        optimizer: torch.optim.Optimizer | None,
        config: FitConfig,
        buffer: DataBuffer,
        version: int,
        features: torch.Tensor | None,
    ) -> dict[str, float]:
        generator = torch.Generator().manual_seed(self.settings.seed + 7919 * version)
        metrics = fit(
            net, buffer.view(), config, generator, arm_features=features, optimizer=optimizer
        )
        if not all(bool(torch.isfinite(p).all()) for p in net.parameters()):
            raise RuntimeError(  # never publish a model that would score NaN
                f"training checkpoint {version} diverged (non-finite parameters); not published"
            )
        return metrics

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
        )
        self._announce(run.version, blob)
        report = self._report(run.version, run, metrics["loss"], self._expire(run, run.version))
        report = dataclasses.replace(report, ascent_rho=metrics["ascent_rho"])
        self._record(report)
        if family is not None and self._metrics is not None:
            losses = {c.name: family.losses[c.name].variance for c in family.candidates}
            self._metrics.record_learners(losses, family.served)
        return report

    def _announce(self, version: int, blob: bytes) -> None:
        """Publish a stored checkpoint; a failure is counted, not fatal (it is durable)."""
        try:
            self._bus.publish(version, blob)
        except Exception as exc:  # e.g. Redis down: a line per run, no traceback
            log.warning(
                "publishing checkpoint %s failed (%s: %s); replicas will poll for it",
                version,
                type(exc).__name__,
                exc,
            )
            if self._metrics is not None:
                self._metrics.trainer_publish_failures.inc()

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
            m.trainer_published.inc()

    def _skipped(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.trainer_skipped.labels(reason).inc()


def _as_candidate(previous: Checkpoint) -> CandidateState:
    """A checkpoint made without a family as the `mlp` candidate: its network, and its
    prequential noise as the loss so far."""
    return CandidateState(
        "mlp", previous.net_config, previous.state, previous.data.noise or Prequential()
    )
