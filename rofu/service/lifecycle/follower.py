"""Checkpoint following: serve the pinned version, else the newest promoted one (the
evaluation gate's, `rofu.service.db.gate_status`), verified first.

The pin and the newest promoted version live in the database, quarantined versions
aside: a Redis pointer ahead of it is ignored. A version's bytes come from the caller's hint, then
Redis, then the durable store, each read only when the ones before it are missing or
refused, and a hint's or Redis's only when they are the bytes the database records
(`rofu.service.lifecycle.copies`); damaged stored bytes are quarantined
(`CheckpointStore.blob`). Without a pin the served version never goes back, unless an
operator rejected it (`rofu reject`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from enum import StrEnum

import redis
import torch

from rofu.models import CheckpointError, RewardNetConfig
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory
from rofu.service.db.tables import PROMOTED, REJECTED, CheckpointRow
from rofu.service.deciding.snapshot import Snapshot, SnapshotHolder
from rofu.service.lifecycle import gate_admin, pinning
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.copies import CheckpointCopies, Copy, Hint
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.metrics import ServiceMetrics

log = logging.getLogger("rofu.follower")
FALLBACK_DEPTH = 10  # older checkpoints tried at start-up when the newest is refused


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
        max_bytes: int | None = None,
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
        self._copies = CheckpointCopies(store, metrics, redis_bus, max_bytes)
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
            with self._lock:
                for row in repository.list_checkpoints(
                    self._sessions, FALLBACK_DEPTH, before=tried
                ):
                    servable = row.quarantined_at is None and row.gate_status == PROMOTED
                    if servable and self._serve(row):
                        break
        if self._holder.current is None:
            newest = repository.latest_checkpoint(self._sessions, with_blob=False)
            self.state = ModelState.COLD_START if newest is None else ModelState.REFUSED

    def sync(self, hint: Hint | None = None) -> int | None:
        """Serve the pinned version, else the newest one; returns that version.

        Called on every bus notice, by the poll loop, by the in-process bus and by the
        admin routes. Each copy is vouched for by the database and verified, and a bad
        one refused, so a corrupted or forged Redis copy falls back to the database's.
        """
        with self._lock:  # one decision at a time: a stale pin read cannot win a race
            pinned = repository.get_pin(self._sessions)
            row = self._newest() if pinned is None else self._stored(pinned)
            if row is None:
                return pinned  # nothing (valid) stored: keep serving what is served
            current = self._holder.current
            if current is not None and current.version == row.version:
                return row.version
            back = pinned is not None
            if not back and current is not None and current.version > row.version:
                if not self._rejected(current):
                    return row.version  # the newer one served was quarantined since: keep it
                back = True  # an operator rejected it: the newest promoted one, older
            self._serve(row, hint, only_newer=not back)
            return row.version

    def _rejected(self, current: Snapshot | None) -> bool:
        """Whether the served checkpoint was rejected since (by an operator): then the
        newest promoted one is served, older or not."""
        if current is None:
            return False
        row = repository.get_checkpoint(self._sessions, current.version, with_blob=False)
        return row is not None and row.gate_status == REJECTED

    def _stored(self, version: int) -> CheckpointRow | None:
        """Stored checkpoint `version`'s row (blob not loaded) unless it is quarantined."""
        row = repository.get_checkpoint(self._sessions, version, with_blob=False)
        return None if row is None or row.quarantined_at is not None else row

    def _newest(self) -> CheckpointRow | None:
        """The newest unquarantined promoted row; a Redis pointer ahead of it names a
        version the database does not hold (forged, or another database's), reported and
        ignored, or one quarantined or rejected since, ignored."""
        pointer = self._pointer()  # read first: the trainer moves it only after its commit
        row = repository.latest_checkpoint(self._sessions, with_blob=False)
        if pointer is None or (row is not None and pointer <= row.version):
            return row
        if repository.get_checkpoint(self._sessions, pointer, with_blob=False) is None:
            self._copies.report(
                f"pointer:{pointer}",
                "unrecorded",
                f"the Redis pointer names checkpoint {pointer}, which the database does not "
                "hold: ignored",
            )
        return row

    def _pointer(self) -> int | None:
        if self._redis is None:
            return None
        try:
            return self._redis.latest_version()
        except redis.RedisError as exc:
            log.warning("checkpoint pointer unavailable (%s); using the database", exc)
        except ValueError as exc:
            self._copies.report(
                f"pointer:{exc}", "unrecorded", f"the Redis pointer is no version ({exc}): ignored"
            )
        return None

    def _serve(
        self, row: CheckpointRow, hint: Hint | None = None, *, only_newer: bool = True
    ) -> bool:
        """Swap in the first copy of stored checkpoint `row` that verifies."""
        return any(self._accept(copy, only_newer=only_newer) for copy in self._copies.of(row, hint))

    def _accept(self, copy: Copy, *, only_newer: bool) -> bool:
        """Verify a copy and swap it in; a bad one is refused (`CheckpointCopies.refuse`)."""
        try:
            snapshot = Snapshot.from_blob(
                copy.blob, self._expect, self._device, hash_seed=self._hash_seed
            )
            if snapshot.version != copy.version:
                raise CheckpointError(f"blob holds version {snapshot.version}")
        except CheckpointError as exc:
            self._copies.refuse(copy, "invalid", str(exc))
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

    def decide(self, version: int, status: str, reason: str | None = None) -> CheckpointRow:
        """Promote or reject stored checkpoint `version` by hand, on every replica (see
        `rofu.service.lifecycle.gate_admin.decide`); this one follows at once."""
        row = gate_admin.decide(self._sessions, version, status, reason, self._redis)
        self.sync()
        return row

    def unpin(self) -> None:
        """Serve the newest promoted checkpoint again, on every replica."""
        pinning.unpin(self._sessions, self._redis)
