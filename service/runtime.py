"""Everything one API process holds, started and closed in order (reverse on close)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis
import torch
from starlette.concurrency import run_in_threadpool

from models import CheckpointError
from service import migrate
from service.batcher import MicroBatcher
from service.bus import InProcessBus
from service.catalogue import CatalogueCache
from service.checkpoint_store import CheckpointStore
from service.db import repository
from service.db.engine import make_engine, ping, session_factory
from service.decision_batch import DecisionBatch, Pending, Result
from service.metrics import ServiceMetrics
from service.redis_bus import RedisBus
from service.scoring import Scorer
from service.security import KeyRing
from service.settings import Settings
from service.snapshot import Snapshot, SnapshotHolder
from service.threads import apply_torch_threads
from service.trainer import Trainer, TrainerLoop

log = logging.getLogger("rofu.runtime")
FALLBACK_DEPTH = 10  # older checkpoints tried at start-up when the newest is refused
T = TypeVar("T")


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is available")
    return torch.device(name)


class Runtime:
    """The resources of one API process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = KeyRing.from_settings(settings)  # refuses production without keys
        self.context_dim = settings.context_dim
        self.device = resolve_device(settings.device)
        self.metrics = ServiceMetrics()
        self.engine = make_engine(settings.database_url)
        self.sessions = session_factory(self.engine)
        self.catalogue = CatalogueCache(self.sessions, settings.arm_refresh_seconds)
        self.holder = SnapshotHolder()
        self.store = CheckpointStore(self.sessions, settings.checkpoint_dir)
        self.redis = (
            None
            if settings.redis_url is None
            else RedisBus(settings.redis_url, prefix=settings.redis_prefix)
        )
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
            scorer, self.sessions, self.catalogue, on_scored=self.metrics.batch_size.observe
        )
        self.batcher: MicroBatcher[Pending, Result] = MicroBatcher(
            decisions,
            max_size=settings.batch_max_size,
            max_wait_s=settings.batch_max_wait_ms / 1000,
        )
        self.trainer_loop: TrainerLoop | None = None
        self.model_state = "starting"
        self._sync_lock = threading.Lock()  # poll, notices, publishes and admin calls
        self._tasks: list[asyncio.Task[None]] = []
        self._blocking_jobs: set[asyncio.Future[Any]] = set()
        self.metrics.track_checkpoint_age(
            lambda: None if self.holder.current is None else self.holder.current.created_at
        )

    async def start(self) -> None:
        """Set torch's threads, check the schema, seed arms, load the checkpoint, start loops."""
        apply_torch_threads(self.settings.torch_threads)
        await run_in_threadpool(self._prepare_database)
        await run_in_threadpool(self._load_initial)
        self.local_bus.subscribe(lambda version, blob: self.sync(hint=(version, blob)))
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
        repository.ensure_arms(self.sessions, specs, self.settings.max_arms)
        self.catalogue.refresh()

    def _load_initial(self) -> None:
        """Load what should be served before reporting ready; fall back to older ones."""
        self.sync()
        if self.holder.current is None and repository.get_pin(self.sessions) is None:
            for row in repository.list_checkpoints(self.sessions, limit=FALLBACK_DEPTH)[1:]:
                blobs = self._copies(row.version, None)
                if any(self.accept(row.version, blob) for blob in blobs):
                    break
        if self.holder.current is None:
            newest = repository.latest_checkpoint(self.sessions, with_blob=False)
            self.model_state = "cold-start" if newest is None else "cold-start: checkpoints refused"

    # Following the trainer --------------------------------------------------------------

    def sync(self, hint: tuple[int, bytes] | None = None) -> None:
        """Serve the pinned version, else the newest one (blocking).

        Called on every bus notice, by the poll loop, and by the in-process bus. Bytes
        come from `hint`, then Redis, then the durable store; each copy is verified and a
        bad one refused, so a corrupted Redis copy falls back to the database's.
        """
        with self._sync_lock:  # one decision at a time: a stale pin read cannot win a race
            pinned = repository.get_pin(self.sessions)
            target = pinned if pinned is not None else self._newest_version()
            current = self.holder.current
            if target is None or (current is not None and current.version == target):
                return
            for blob in self._copies(target, hint):
                if self.accept(target, blob, only_newer=pinned is None):
                    return

    def _newest_version(self) -> int | None:
        versions = []
        if self.redis is not None:
            try:
                versions.append(self.redis.latest_version())
            except redis.RedisError as exc:
                log.warning("checkpoint pointer unavailable (%s); using the database", exc)
        row = repository.latest_checkpoint(self.sessions, with_blob=False)
        versions.append(None if row is None else row.version)
        known = [v for v in versions if v is not None]
        return max(known) if known else None

    def _copies(self, version: int, hint: tuple[int, bytes] | None) -> list[bytes]:
        copies = []
        if hint is not None and hint[0] == version:
            copies.append(hint[1])
        if self.redis is not None:
            try:
                blob = self.redis.fetch(version)
                if blob is not None:
                    copies.append(blob)
            except redis.RedisError as exc:
                log.warning("checkpoint %s unavailable from Redis (%s)", version, exc)
        try:
            stored = self.store.get(version)
        except CheckpointError as exc:
            log.error("stored checkpoint %s unusable: %s", version, exc)
            self.metrics.checkpoint_rejected.inc()
            stored = None
        if stored is not None:
            copies.append(stored[1])
        return copies

    def accept(self, version: int, blob: bytes, *, only_newer: bool = True) -> bool:
        """Verify a checkpoint and swap it in; a bad one is refused, logged and counted."""
        try:
            snapshot = Snapshot.from_blob(blob, self.settings.net_config(), self.device)
            if snapshot.version != version:
                raise CheckpointError(f"blob holds version {snapshot.version}, not {version}")
        except CheckpointError as exc:
            log.error("refused checkpoint %s: %s", version, exc)
            self.metrics.checkpoint_rejected.inc()
            return False
        if not self.holder.swap(snapshot, only_newer=only_newer):
            return True  # a newer one arrived meanwhile
        self.model_state = "loaded"
        self.metrics.model_version.set(snapshot.version)
        self.metrics.checkpoint_swaps.inc()
        log.info("serving checkpoint %s", snapshot.version)
        return True

    async def _on_notice(self, message: str) -> None:
        try:
            await self._in_thread(self.sync)
        except Exception:  # e.g. the database is down: keep serving, the poll retries
            log.exception("checkpoint sync after notice %r failed", message)

    async def _poll(self) -> None:
        """Fallback for missed notices: check the pointer and the store periodically."""
        while True:
            await asyncio.sleep(self.settings.checkpoint_poll_seconds)
            await self._on_notice("poll")
            try:
                await self._in_thread(self.catalogue.fresh)
            except Exception as exc:  # e.g. the database is down: keep the cached catalogue
                log.warning("arm catalogue refresh failed (%s); retrying at the next poll", exc)

    # Health and shutdown ----------------------------------------------------------------

    def database_ok(self) -> bool:
        """Whether the database answers (blocking)."""
        try:
            ping(self.engine)
        except Exception:
            return False
        return True

    async def aclose(self) -> None:
        """Stop loops, the trainer and the batcher; release Redis and the database."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self._blocking_jobs, return_exceptions=True)
        if self.trainer_loop is not None:
            await run_in_threadpool(self.trainer_loop.stop)
        await self.batcher.aclose()
        if self.redis is not None:
            self.redis.close()
        self.engine.dispose()
