"""The trainer: a loop around the pure `models.fit`.

Each run reads the decisions whose reward window has closed and that no checkpoint has
consumed yet, refits theta_t from theta_{t-1} (the latest durable checkpoint) on the
checkpoint's data sample plus the new rows, stores the new checkpoint durably together
with the mark on the consumed decisions (one transaction), then publishes it. A run takes
the preset's optimizer steps per new row (`Settings.fit_config`), and with `fit_persist`
continues its optimizer while it continues the checkpoint it published last.

Reward-window rule: a decision is consumed once `reward_window_seconds` have passed since
it was made. If its reward arrived by then it is trained on; if not, it is trained on
with `default_reward` when that is set, and otherwise excluded (consumed, never trained
on). A reward that arrives after its decision was consumed is stored but not trained on.
This keeps arms with slow feedback on an equal footing with fast ones.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import torch

from models import (
    Checkpoint,
    DataBuffer,
    FitConfig,
    RegulariserData,
    RewardNet,
    Transitions,
    dump_checkpoint,
    fit,
    load_checkpoint,
)
from models.training import make_optimizer
from service.bus import CheckpointBus
from service.catalogue import CatalogueCache
from service.checkpoint_store import CheckpointStore
from service.db import repository
from service.db.engine import SessionFactory
from service.metrics import ServiceMetrics
from service.settings import Settings

log = logging.getLogger("rofu.trainer")
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
    loss: float
    seconds: float


class Trainer:
    """Turns closed decisions into the next checkpoint."""

    def __init__(
        self,
        settings: Settings,
        sessions: SessionFactory,
        store: CheckpointStore,
        bus: CheckpointBus,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self._sessions = sessions
        self._store = store
        self._bus = bus
        self._metrics = metrics
        self._clock = clock
        self._catalogue = CatalogueCache(sessions, ttl_s=0.0)
        self._kept: _Kept | None = None  # the optimizer fit_persist carries over

    def run_once(self) -> TrainReport | None:
        """One run; None when no decision's window has closed since the last."""
        started = time.perf_counter()
        window = timedelta(seconds=self.settings.reward_window_seconds)
        rows = repository.closed_decisions(self._sessions, self._clock() - window, MAX_ROWS_PER_RUN)
        if not rows:
            return None
        latest = self._store.latest()
        previous = None
        if latest is not None:
            previous = load_checkpoint(latest[1], expect=self.settings.net_config())
        version = 1 if previous is None else previous.version + 1
        log.info("training checkpoint %s on %s closed decisions", version, len(rows))
        used = [(row, self._target(row)) for row in rows]
        trained = [(row, target) for row, target in used if target is not None]
        buffer = self._buffer(previous, version)
        if trained:
            buffer.append(_transitions(trained, self.settings.context_dim))
        if len(buffer) == 0:  # nothing to learn from yet: consume the rows, keep the model
            return self._consume_without_model(rows, version, started)
        config = self.settings.fit_config(new_rows=len(trained))
        net, optimizer = self._continue(previous, config)
        features, metrics = self._fit(net, optimizer, config, buffer, version)
        report = self._publish(net, buffer, features, metrics, version, rows, trained, started)
        if optimizer is not None:
            self._kept = _Kept(version, net, optimizer, dataclasses.replace(config, steps=0))
        return report

    def _target(self, row: repository.TrainingRow) -> float | None:
        """The training target, or None to exclude the row (no reward and no default, or
        values beyond the configured bounds, e.g. logged before a bound was lowered)."""
        target = row.reward if row.reward is not None else self.settings.default_reward
        if target is None or abs(target) > self.settings.max_abs_reward:
            return None
        if any(abs(v) > self.settings.max_abs_feature for v in row.context):
            return None
        return target

    def _buffer(self, previous: Checkpoint | None, version: int) -> DataBuffer:
        generator = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + version)
        size = self.settings.data_sample_size
        if previous is None:
            return DataBuffer(self.settings.context_dim, max_size=size, generator=generator)
        data = previous.data
        if len(data.sample) > size:  # the sample-size setting shrank: keep a uniform subset
            keep = torch.randperm(len(data.sample), generator=generator)[:size]
            data = RegulariserData(data.sample.subset(keep), data.n_total, data.arm_counts)
        return DataBuffer.restore(data, max_size=size, generator=generator)

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
            return (previous.network() if previous else RewardNet(self.settings.net_config())), None
        if (
            kept is not None
            and previous is not None
            and kept.version == previous.version
            and kept.config == dataclasses.replace(config, steps=0)
        ):
            return kept.net, kept.optimizer
        net = previous.network() if previous else RewardNet(self.settings.net_config())
        return net, make_optimizer(net, config)

    def _fit(
        self,
        net: RewardNet,
        optimizer: torch.optim.Optimizer | None,
        config: FitConfig,
        buffer: DataBuffer,
        version: int,
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        features = None
        if self.settings.arm_feature_dim:
            features = self._catalogue.refresh().feature_table(self.settings.arm_feature_dim)
        generator = torch.Generator().manual_seed(self.settings.seed + 7919 * version)
        metrics = fit(
            net, buffer.view(), config, generator, arm_features=features, optimizer=optimizer
        )
        if not all(bool(torch.isfinite(p).all()) for p in net.parameters()):
            raise RuntimeError(  # never publish a model that would score NaN
                f"training checkpoint {version} diverged (non-finite parameters); not published"
            )
        return features, metrics

    def _publish(
        self,
        net: RewardNet,
        buffer: DataBuffer,
        features: torch.Tensor | None,
        metrics: dict[str, float],
        version: int,
        rows: list[repository.TrainingRow],
        trained: list[tuple[repository.TrainingRow, float]],
        started: float,
    ) -> TrainReport:
        n_slots = self.settings.max_arms if features is None else features.shape[0]
        data = buffer.regulariser_data(n_slots)
        checkpoint = Checkpoint(
            version=version,
            net_config=self.settings.net_config(),
            state={k: v.detach().cpu() for k, v in net.state_dict().items()},
            data=data,
            arm_features=features,
            metrics=metrics,
            extra={
                "created_at": str(time.time()),
                "parent_version": str(version - 1),
                "config": json.dumps(self.settings.model_config_record(), sort_keys=True),
            },
        )
        blob = dump_checkpoint(checkpoint)
        self._store.save(
            version,
            blob,
            metrics=metrics,
            rows_trained=len(trained),
            n_total=data.n_total,
            consumed=[row.event_id for row in rows],
        )
        self._announce(version, blob)
        report = self._report(version, rows, trained, metrics["loss"], started)
        self._record(report)
        return report

    def _announce(self, version: int, blob: bytes) -> None:
        """Publish a stored checkpoint; a failure is counted, not fatal (it is durable)."""
        try:
            self._bus.publish(version, blob)
        except Exception:
            log.exception("publishing checkpoint %s failed; replicas will poll for it", version)
            if self._metrics is not None:
                self._metrics.trainer_publish_failures.inc()

    def _consume_without_model(
        self, rows: list[repository.TrainingRow], version: int, started: float
    ) -> TrainReport:
        repository.mark_consumed(self._sessions, [row.event_id for row in rows], version - 1)
        report = self._report(version - 1, rows, [], float("nan"), started)
        self._record(report)
        return report

    def _report(
        self,
        version: int,
        rows: list[repository.TrainingRow],
        trained: list[tuple[repository.TrainingRow, float]],
        loss: float,
        started: float,
    ) -> TrainReport:
        rewarded = sum(1 for row, _ in trained if row.reward is not None)
        return TrainReport(
            version=version,
            consumed=len(rows),
            rewarded=rewarded,
            defaulted=len(trained) - rewarded,
            excluded=len(rows) - len(trained),
            loss=loss,
            seconds=time.perf_counter() - started,
        )

    def _record(self, report: TrainReport) -> None:
        log.info("training run: %s", report)
        if self._metrics is None:
            return
        m = self._metrics
        m.trainer_rows.labels("rewarded").inc(report.rewarded)
        m.trainer_rows.labels("default").inc(report.defaulted)
        m.trainer_rows.labels("excluded").inc(report.excluded)
        m.trainer_duration.observe(report.seconds)
        if report.rewarded + report.defaulted:
            m.trainer_loss.set(report.loss)
            m.trainer_published.inc()


def _transitions(
    trained: list[tuple[repository.TrainingRow, float]], context_dim: int
) -> Transitions:
    x = torch.tensor([row.context for row, _ in trained], dtype=torch.float32)
    return Transitions(
        x.view(len(trained), context_dim),
        torch.tensor([row.slot for row, _ in trained], dtype=torch.int64),
        torch.tensor([target for _, target in trained], dtype=torch.float32),
    )


class TrainerLoop:
    """Runs the trainer every `train_every_rewards` new rewards or `train_interval_seconds`."""

    def __init__(self, trainer: Trainer, sessions: SessionFactory) -> None:
        self._trainer = trainer
        self._sessions = sessions
        self._metrics = trainer._metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_run = float("-inf")
        self._rewards_at_last_run = 0

    def due(self) -> bool:
        """Whether enough rewards arrived or enough time passed since the last run."""
        settings = self._trainer.settings
        if time.monotonic() - self._last_run >= settings.train_interval_seconds:
            return True
        new = repository.count_rewards(self._sessions) - self._rewards_at_last_run
        return new >= settings.train_every_rewards

    def step(self) -> TrainReport | None:
        """Run once if due; failures are logged and counted, never raised."""
        if not self.due():
            return None
        self._rewards_at_last_run = repository.count_rewards(self._sessions)
        self._last_run = time.monotonic()
        try:
            return self._trainer.run_once()
        except Exception:
            log.exception("training run failed")
            if self._metrics is not None:
                self._metrics.trainer_failures.inc()
            return None

    def run_forever(self, poll_s: float = 0.5) -> None:
        """Step until `stop()`."""
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a database outage while checking: try again later
                log.exception("trainer loop check failed")
            self._stop.wait(poll_s)

    def start(self) -> None:
        """Run in a background thread (the embedded default)."""
        self._thread = threading.Thread(target=self.run_forever, name="rofu-trainer", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the loop to stop after the run in progress (safe from a signal handler)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the background thread, waiting for a run in progress to finish."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join()
