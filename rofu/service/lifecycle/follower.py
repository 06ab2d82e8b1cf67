"""Checkpoint following: serve the pinned version, else the newest one, verified first.

The pin lives in the database; the newest version is the larger of the Redis pointer and
the newest stored row, quarantined versions aside. A version's bytes come from the
caller's hint, then Redis, then the durable store, each read only when the ones before it
are missing or refused; damaged stored bytes are quarantined (`CheckpointStore.blob`).
Without a pin the served version never goes back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from enum import StrEnum

import redis
import torch

from rofu.models import CheckpointError, RewardNetConfig
from rofu.service.db import quarantine, repository
from rofu.service.db.engine import SessionFactory
from rofu.service.deciding.snapshot import Snapshot, SnapshotHolder
from rofu.service.lifecycle import pinning
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.metrics import ServiceMetrics

log = logging.getLogger("rofu.follower")
FALLBACK_DEPTH = 10  # older checkpoints tried at start-up when the newest is refused
Hint = tuple[int, bytes]  # (version, blob) handed over by the in-process bus


class ModelState(StrEnum):
    """What the replica serves; /readyz reports the value."""

    STARTING = "starting"
    LOADED = "loaded"
    COLD_START = "cold-start"  # no valid checkpoint exists (yet): uniform decisions
    REFUSED = "cold-start: checkpoints refused"  # every valid one was refused here

    @property
    def ready(self) -> bool:
        """Whether the replica serves as intended (a refused checkpoint is not)."""
        return self in (ModelState.LOADED, ModelState.COLD_START)


class CheckpointFollower:
    """Follows the trainer's checkpoints into `holder` (blocking calls, thread-safe)."""

    def __init__(
        self,
        sessions: SessionFactory,
        store: CheckpointStore,
        holder: SnapshotHolder,
        metrics: ServiceMetrics,
        expect: RewardNetConfig | Sequence[RewardNetConfig],
        device: torch.device,
        redis_bus: RedisBus | None = None,
        *,
        hash_seed: int,
    ) -> None:
        self.state = ModelState.STARTING
        self._sessions = sessions
        self._store = store
        self._holder = holder
        self._metrics = metrics
        self._expect = expect
        self._hash_seed = hash_seed  # a checkpoint of another feature hash seed is refused
        self._device = device
        self._redis = redis_bus
        self._lock = threading.Lock()  # poll, notices, publishes and admin calls

    @property
    def serving(self) -> int:
        """The served version (0: none yet)."""
        current = self._holder.current
        return 0 if current is None else current.version

    def load_initial(self) -> None:
        """Load what should be served before reporting ready; fall back to older ones.

        With no valid checkpoint at all (none yet, or every one quarantined) the replica
        is ready on the cold start; with valid ones that it refuses, it is not.
        """
        tried = self.sync()
        if self._holder.current is None and tried and repository.get_pin(self._sessions) is None:
            for row in repository.list_checkpoints(self._sessions, FALLBACK_DEPTH, before=tried):
                if row.quarantined_at is None and any(
                    self.accept(row.version, blob) for blob in self.copies(row.version)
                ):
                    break
        if self._holder.current is None:
            newest = repository.latest_checkpoint(self._sessions, with_blob=False)
            self.state = ModelState.COLD_START if newest is None else ModelState.REFUSED

    def sync(self, hint: Hint | None = None) -> int | None:
        """Serve the pinned version, else the newest one; returns that version.

        Called on every bus notice, by the poll loop, by the in-process bus and by the
        admin routes. Each copy is verified and a bad one refused, so a corrupted Redis
        copy falls back to the database's.
        """
        with self._lock:  # one decision at a time: a stale pin read cannot win a race
            pinned = repository.get_pin(self._sessions)
            target = pinned if pinned is not None else self._newest_version()
            current = self._holder.current
            if target is None or (current is not None and current.version == target):
                return target
            if pinned is None and current is not None and current.version > target:
                return target  # the newer one served was quarantined since: keep it
            for blob in self.copies(target, hint):
                if self.accept(target, blob, only_newer=pinned is None):
                    break
            return target

    def _newest_version(self) -> int | None:
        """The newest valid version: the Redis pointer unless the database has it
        quarantined, or the newest unquarantined row."""
        row = repository.latest_checkpoint(self._sessions, with_blob=False)
        stored = None if row is None else row.version
        pointer = None
        if self._redis is not None:
            try:
                pointer = self._redis.latest_version()
            except redis.RedisError as exc:
                log.warning("checkpoint pointer unavailable (%s); using the database", exc)
        if pointer is None or (stored is not None and pointer <= stored):
            return stored
        return stored if quarantine.is_quarantined(self._sessions, pointer) else pointer

    def copies(self, version: int, hint: Hint | None = None) -> Iterator[bytes]:
        """The copies of `version`'s bytes, best first; each is read only when asked for."""
        if hint is not None and hint[0] == version:
            yield hint[1]
        if self._redis is not None:
            try:
                blob = self._redis.fetch(version)
            except redis.RedisError as exc:
                log.warning("checkpoint %s unavailable from Redis (%s)", version, exc)
                blob = None
            if blob is not None:
                yield blob
        try:
            stored = self._store.get(version)
        except CheckpointError as exc:
            log.error("stored checkpoint %s unusable: %s", version, exc)
            self._metrics.checkpoint_rejected.inc()
            return
        if stored is not None:
            yield stored[1]

    def accept(self, version: int, blob: bytes, *, only_newer: bool = True) -> bool:
        """Verify a checkpoint and swap it in; a bad one is refused, logged and counted."""
        try:
            snapshot = Snapshot.from_blob(
                blob, self._expect, self._device, hash_seed=self._hash_seed
            )
            if snapshot.version != version:
                raise CheckpointError(f"blob holds version {snapshot.version}, not {version}")
        except CheckpointError as exc:
            log.error("refused checkpoint %s: %s", version, exc)
            self._metrics.checkpoint_rejected.inc()
            return False
        if not self._holder.swap(snapshot, only_newer=only_newer):
            return True  # a newer one arrived meanwhile
        self.state = ModelState.LOADED
        self._metrics.model_version.set(snapshot.version)
        self._metrics.checkpoint_swaps.inc()
        log.info("serving checkpoint %s", snapshot.version)
        return True

    # Rollback ---------------------------------------------------------------------------

    def pinned(self) -> int | None:
        """The pinned version (None: the newest is served)."""
        return repository.get_pin(self._sessions)

    def pin(self, version: int) -> None:
        """Pin every replica to stored checkpoint `version` (see
        `rofu.service.lifecycle.pinning.pin`)."""
        pinning.pin(
            self._sessions,
            self._store,
            self._expect,
            version,
            self._redis,
            hash_seed=self._hash_seed,
        )

    def unpin(self) -> None:
        """Serve the newest checkpoint again, on every replica."""
        pinning.unpin(self._sessions, self._redis)
