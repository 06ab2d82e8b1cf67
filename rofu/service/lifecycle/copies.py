"""A checkpoint version's copies, best first, each vouched for by the database.

The database is the truth and the bus a cache that is never trusted: whoever reaches Redis
can write its keys, and a checkpoint's own checksum is one anyone can recompute. A copy of
version v from the in-process bus or from Redis is used only when v is stored, not
quarantined, and the copy holds the bytes the database records for v (its checksum,
`CheckpointRow.checksum`); the database's own copy comes next. No copy larger than the
byte limit is read: Redis's is measured (STRLEN) before it is fetched, the store's from
its row or file (`CheckpointStore.get`).

A refused copy is logged and counted once (`rofu_checkpoint_rejected_total{reason}`) and
never read again: its bytes are remembered by their SHA-256, and where it lies (the Redis
key or the stored row of v) is not read again either. Bytes that cannot be read at all
(Redis down, a missing file) are not remembered: they may come back.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import redis

from rofu.models import CheckpointError
from rofu.models.checkpoint import checkpoint_checksum
from rofu.service.db.tables import CheckpointRow
from rofu.service.lifecycle.checkpoint_store import (
    CheckpointStore,
    CorruptCheckpoint,
    OversizedCheckpoint,
)
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.metrics import ServiceMetrics

log = logging.getLogger("rofu.follower")
Hint = tuple[int, bytes]  # (version, blob) handed over by the in-process bus


@dataclass(frozen=True)
class Copy:
    """A copy of checkpoint `version`'s bytes and where it came from: hint, redis or store."""

    version: int
    source: str
    blob: bytes

    @cached_property
    def digest(self) -> str:
        """The SHA-256 of the bytes, by which a refused copy is remembered."""
        return hashlib.sha256(self.blob).hexdigest()


class CheckpointCopies:
    """Reads a replica's checkpoint copies and remembers the refused ones (callers hold
    the follower's lock)."""

    def __init__(
        self,
        store: CheckpointStore,
        metrics: ServiceMetrics,
        redis_bus: RedisBus | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._redis = redis_bus
        self._max_bytes = max_bytes  # None: no limit
        self._digests: set[str] = set()  # of refused bytes
        self._closed: set[str] = set()  # places (and pointers) refused once, never again

    def of(self, row: CheckpointRow, hint: Hint | None = None) -> Iterator[Copy]:
        """The copies of stored checkpoint `row`'s bytes, best first; each is read only
        when asked for, and a hint's or Redis's only when it is the recorded one."""
        version = row.version
        if hint is not None and hint[0] == version:
            yield from self._vouched(row, Copy(version, "hint", hint[1]))
        if self._redis is not None and f"redis:{version}" not in self._closed:
            blob = self._from_redis(self._redis, version)
            if blob is not None:
                yield from self._vouched(row, Copy(version, "redis", blob))
        if f"store:{version}" not in self._closed:
            stored = self._from_store(version)
            if stored is not None and not self._known(stored):
                yield stored

    def refuse(self, copy: Copy, reason: str, why: str) -> None:
        """Log, count and remember a refused copy: neither its bytes nor its place are
        read again."""
        self._digests.add(copy.digest)
        self.report(
            f"{copy.source}:{copy.version}",
            reason,
            f"refused checkpoint {copy.version} from {copy.source} "
            f"(sha256 {copy.digest[:16]}): {why}",
        )

    def report(self, key: str, reason: str, message: str) -> None:
        """Log and count a refusal of `reason`, once per `key`."""
        if key in self._closed:
            return
        self._closed.add(key)
        log.error("%s", message)
        self._metrics.checkpoint_rejected.labels(reason).inc()

    def _known(self, copy: Copy) -> bool:
        """Whether `copy`'s bytes were refused already; then its place is not read again."""
        if copy.digest not in self._digests:
            return False
        self._closed.add(f"{copy.source}:{copy.version}")
        return True

    def _vouched(self, row: CheckpointRow, copy: Copy) -> Iterator[Copy]:
        """`copy`, unless it was refused already or is not the stored row's bytes."""
        if self._known(copy):
            return
        if self._max_bytes is not None and len(copy.blob) > self._max_bytes:
            size = len(copy.blob)
            self.refuse(copy, "oversized", f"{size} bytes, over the limit of {self._max_bytes}")
            return
        try:
            checksum = checkpoint_checksum(copy.blob)
        except CheckpointError as exc:
            self.refuse(copy, "invalid", str(exc))
            return
        if checksum != row.checksum:
            why = f"checksum {checksum[:16]}, the database records {row.checksum[:16]}"
            self.refuse(copy, "mismatch", why)
            return
        yield copy

    def _from_redis(self, bus: RedisBus, version: int) -> bytes | None:
        try:
            return bus.fetch(version, self._max_bytes)
        except OversizedCheckpoint as exc:
            self.report(f"redis:{version}", "oversized", f"refused {exc}")
        except redis.RedisError as exc:
            log.warning("checkpoint %s unavailable from Redis (%s)", version, exc)
        return None

    def _from_store(self, version: int) -> Copy | None:
        try:
            stored = self._store.get(version)
        except OversizedCheckpoint as exc:
            self.report(f"store:{version}", "oversized", f"refused {exc}")
            return None
        except CorruptCheckpoint as exc:  # quarantined: never asked for again
            self.report(f"store:{version}", "invalid", f"refused stored checkpoint: {exc}")
            return None
        except CheckpointError as exc:  # cannot be read now: it may come back
            log.error("stored checkpoint %s unusable: %s", version, exc)
            self._metrics.checkpoint_rejected.labels("unreadable").inc()
            return None
        return None if stored is None else Copy(version, "store", stored[1])
