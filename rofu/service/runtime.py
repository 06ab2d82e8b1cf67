"""Everything one API process holds, started and closed in order (reverse on close)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from rofu.service import migrate
from rofu.service.api.security import KeyRing
from rofu.service.db import arms as arm_rows
from rofu.service.db import faults
from rofu.service.db.engine import (
    DatabaseLimits,
    in_memory,
    make_engine,
    probe_write,
    session_factory,
)
from rofu.service.db.write_health import WriteHealth
from rofu.service.deciding.batch import DecisionBatch, Pending, Result
from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.deciding.catalogue import ARMS_NOTICE, CatalogueCache
from rofu.service.deciding.scoring import Scorer
from rofu.service.deciding.snapshot import SnapshotHolder
from rofu.service.lifecycle.bus import InProcessBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.follower import CheckpointFollower
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.schedule import TrainerLoop
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from rofu.service.rewards.record import RewardBatch, RewardBatcher
from rofu.service.settings import Settings
from rofu.service.threads import apply_torch_threads

log = logging.getLogger("rofu.runtime")
T = TypeVar("T")


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is available")
    return torch.device(name)


class Runtime:
    """The resources of one API process: built here, started in order, closed in reverse.

    Routes reach its parts through `rofu.service.api.deps`, never the runtime itself.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = KeyRing.from_settings(settings)  # refuses production without keys
        self.device = resolve_device(settings.device)
        self.metrics = ServiceMetrics()
        self.engine = make_engine(settings.database_url, DatabaseLimits.of(settings))
        self.faults = faults.DatabaseFaults(
            lambda cause: self.metrics.database_errors.labels(cause).inc()
        )
        for cause in faults.CAUSES:  # every cause exported from the start, at 0
            self.metrics.database_errors.labels(cause)
        self.writes = WriteHealth()
        self.writes.watch(self.engine)
        self.sessions = session_factory(self.engine)
        self.decision_engine = self._decision_engine()
        decision_sessions = self.sessions
        if self.decision_engine is not self.engine:
            self.writes.watch(self.decision_engine)
            decision_sessions = session_factory(self.decision_engine)
        self.catalogue = CatalogueCache(self.sessions, settings.arm_refresh_seconds)
        self.holder = SnapshotHolder()
        max_bytes = settings.checkpoint_byte_limit()
        self.store = CheckpointStore(
            self.sessions, settings.checkpoint_dir, self.metrics, max_bytes=max_bytes
        )
        self.redis = None if settings.redis_url is None else RedisBus.of(settings)
        self.local_bus = InProcessBus()
        scorer = Scorer(
            self.holder,
            self.catalogue,
            settings.rofu_config(),
            settings.arm_feature_dim,
            settings.seed,
            cuda_graphs=settings.cuda_graphs,
        )
        decisions = DecisionBatch(
            scorer,
            decision_sessions,
            self.catalogue,
            on_scored=self.metrics.batch_size.observe,
            apprentice=settings.learning_mode == "apprentice",
            hash_seed=settings.feature_hash_seed,
            holdout=(settings.holdout_share, settings.holdout_salt),
        )
        self.batcher: MicroBatcher[Pending, Result] = MicroBatcher(
            decisions,
            max_size=settings.batch_max_size,
            max_wait_s=settings.batch_max_wait_ms / 1000,
            max_pending=settings.select_queue_limit(),
            on_shed=self.metrics.select_shed.inc,
        )
        self.metrics.track_select_queue(lambda: self.batcher.pending)
        self.reward_batcher: RewardBatcher = MicroBatcher(
            RewardBatch(self.sessions, settings.reward_window_seconds),
            max_size=settings.batch_max_size,
            max_wait_s=0.0,  # a batch is what queued while the previous one was written
            on_batch=self.metrics.reward_batch_size.observe,
        )
        self.follower = CheckpointFollower(
            self.sessions,
            self.store,
            self.holder,
            self.metrics,
            settings.served_net_configs(),
            self.device,
            self.redis,
            hash_seed=settings.feature_hash_seed,
            max_bytes=max_bytes,
        )
        self.trainer_loop: TrainerLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._blocking_jobs: set[asyncio.Future[Any]] = set()
        self._probe: asyncio.Task[faults.DatabaseStatus] | None = None
        self._database_failing = False
        self.metrics.track_checkpoint_age(
            lambda: None if self.holder.current is None else self.holder.current.created_at
        )

    def _decision_engine(self) -> Engine:
        """The engine /select stores its decisions with: the main one under
        `ROFU_DECISION_DURABILITY=flush` (and for an in-memory SQLite database, which a
        second engine would not share), else one whose commits are not flushed."""
        url = self.settings.database_url
        if self.settings.decision_durability == "flush" or in_memory(url):
            return self.engine
        return make_engine(url, DatabaseLimits.of(self.settings), flush=False)

    async def start(self) -> None:
        """Set torch's threads, check the schema, seed arms, load the checkpoint, start loops."""
        apply_torch_threads(self.settings.torch_threads)
        await run_in_threadpool(self._prepare_database)
        await run_in_threadpool(self.follower.load_initial)
        self.local_bus.subscribe(lambda version, blob: self.follower.sync(hint=(version, blob)))
        settings = self.settings
        if settings.in_process_trainer:
            trainer = Trainer(settings, self.sessions, self.store, self.local_bus, self.metrics)
            self.trainer_loop = TrainerLoop(trainer, self.sessions)
            self.trainer_loop.start()
        self._spawn(self._poll(), "rofu-checkpoint-poll")
        if self.redis is not None:
            self._spawn(self.redis.listen(self._on_notice), "rofu-checkpoint-listen")

    def _spawn(self, coroutine: object, name: str) -> None:
        self._tasks.append(asyncio.create_task(coroutine, name=name))  # type: ignore[arg-type]

    async def _in_thread(self, function: Callable[[], T]) -> T:
        """Run a background loop's blocking `function` in a worker thread `aclose` waits for.

        Cancelling a loop does not stop a thread it started: without the wait, a query
        still running at shutdown would check its connection in to the disposed pool,
        which leaves it open.
        """
        job = asyncio.ensure_future(run_in_threadpool(function))
        self._blocking_jobs.add(job)
        job.add_done_callback(self._blocking_jobs.discard)
        return await asyncio.shield(job)

    def _prepare_database(self) -> None:
        current, head = migrate.current_revision(self.engine), migrate.head_revision()
        if current != head:
            if not (self.settings.mode == "embedded" and self.settings.is_sqlite):
                raise RuntimeError(
                    f"database schema is at {current}, expected {head}: run `rofu migrate`"
                )
            migrate.upgrade(self.settings.database_url)
        specs = [(arm.id, arm.features) for arm in self.settings.arms]
        arm_rows.ensure_arms(self.sessions, specs, self.settings.max_arms)
        self.catalogue.refresh()

    async def _on_notice(self, message: str) -> None:
        """Follow a bus notice (or a poll) in a thread that `aclose` waits for: reload the
        arm catalogue on an arms notice, else sync the checkpoint."""
        if message == ARMS_NOTICE:
            try:
                await self._in_thread(self.catalogue.refresh)
            except Exception as exc:  # e.g. the database is down: the poll retries
                log.warning("arm catalogue reload after a notice failed (%s)", exc)
            return
        try:
            await self._in_thread(self.follower.sync)
        except Exception as exc:  # e.g. the database is down: keep serving, the poll retries
            if not self.faults.record_exception(exc, f"checkpoint sync ({message})"):
                log.exception("checkpoint sync after notice %r failed", message)

    async def _poll(self) -> None:
        """Fallback for missed notices: check the pointer and the store periodically."""
        while True:
            await asyncio.sleep(self.settings.checkpoint_poll_seconds)
            await self._on_notice("poll")
            try:
                await self._in_thread(self.catalogue.fresh)
            except Exception as exc:  # e.g. the database is down: keep the cached catalogue
                if not self.faults.record_exception(exc, "arm catalogue refresh (poll)"):
                    log.warning("arm catalogue refresh failed (%s); retrying at the next poll", exc)

    # Health and shutdown ----------------------------------------------------------------

    async def check_database(self) -> faults.DatabaseStatus:
        """Whether the database takes reads and writes (the probe's, and the process's for
        the last `readyz_write_failure_seconds`), answered within `readyz_timeout_seconds`.
        One probe runs at a time: callers meanwhile share it."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._in_thread(self._probe_database))
        bound = self.settings.readyz_timeout_seconds
        try:
            return await asyncio.wait_for(asyncio.shield(self._probe), bound)
        except TimeoutError:
            status = faults.DatabaseStatus("timeout", "timeout", f"no answer within {bound:g}s")
            self.faults.record("timeout", status.detail, "the readiness probe")
            return status

    def _probe_database(self) -> faults.DatabaseStatus:
        """One readiness probe (blocking): a failure is recorded, a recovery logged.

        While the process's writes fail, the probe also commits a write: a replica taken
        out of the load balancer gets no traffic, so only it can see writes work again.
        """
        status = faults.probe(self.engine)
        if not status.ok:
            self.faults.record(status.cause or "other", status.detail, "the readiness probe")
        elif self.writes.failure is not None:
            self._commit_probe()
            status = self.writes.status(self.settings.readyz_write_failure_seconds)
        if status.ok and self._database_failing:
            log.info("database takes reads and writes again")
        self._database_failing = not status.ok
        return status

    def _commit_probe(self) -> None:
        """Commit a write that leaves nothing behind; its outcome reaches `self.writes`."""
        try:
            probe_write(self.engine, commit=True)
        except Exception as exc:
            if not self.faults.record_exception(exc, "the readiness probe's commit"):
                log.exception("the readiness probe's commit failed")

    async def aclose(self) -> None:
        """Stop loops, the trainer and the batchers; release Redis and the database."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._probe is not None:
            self._probe.cancel()
        await asyncio.gather(*self._blocking_jobs, return_exceptions=True)
        if self.trainer_loop is not None:
            await run_in_threadpool(self.trainer_loop.stop)
        await self.reward_batcher.aclose()
        await self.batcher.aclose()
        if self.redis is not None:
            self.redis.close()
        self.engine.dispose()
        self.decision_engine.dispose()
