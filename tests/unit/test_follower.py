"""CheckpointFollower on SQLite with a fake Redis: copies read lazily, verified, swapped."""

from __future__ import annotations

import pytest
import redis
import torch

from rofu.models import Checkpoint, RegulariserData, dump_checkpoint
from rofu.service import migrate
from rofu.service.db import repository
from rofu.service.db.engine import SessionFactory, make_engine, session_factory
from rofu.service.db.tables import CheckpointRow
from rofu.service.deciding.snapshot import SnapshotHolder
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.follower import CheckpointFollower, ModelState
from rofu.service.metrics import ServiceMetrics
from tests.factories import make_net, make_transitions

EXPECT = make_net(3, 2, hidden=(4,)).config


def _blob(version: int, hidden: tuple[int, ...] = (4,), *, seed: int | None = None) -> bytes:
    net = make_net(3, 2, hidden=hidden)
    sample = make_transitions(6, 3, 2, seed=version if seed is None else seed)
    data = RegulariserData(sample, 6, sample.arms.bincount(minlength=2))
    return dump_checkpoint(Checkpoint(version, net.config, net.state_dict(), data))


def _damaged(blob: bytes) -> bytes:
    damaged = bytearray(blob)
    damaged[-10] ^= 0x01
    return bytes(damaged)


class FakeRedis:
    """The follower's view of the Redis bus: a pointer and copies, recording each read."""

    def __init__(self, copies: dict[int, bytes], *, down: bool = False) -> None:
        self.copies = copies
        self.down = down
        self.fetched: list[int] = []

    def latest_version(self) -> int | None:
        if self.down:
            raise redis.ConnectionError("redis is down")
        return max(self.copies, default=None)

    def fetch(self, version: int, max_bytes: int | None = None) -> bytes | None:
        self.fetched.append(version)
        if self.down:
            raise redis.ConnectionError("redis is down")
        return self.copies.get(version)


class SpyStore(CheckpointStore):
    """The durable store, recording which versions were read."""

    def __init__(self, sessions: SessionFactory) -> None:
        super().__init__(sessions)
        self.read: list[int] = []

    def get(self, version: int) -> tuple[CheckpointRow, bytes] | None:
        self.read.append(version)
        return super().get(version)


@pytest.fixture
def sessions(tmp_path):
    url = f"sqlite:///{tmp_path}/follower.sqlite"
    migrate.upgrade(url)
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def store(sessions) -> SpyStore:
    return SpyStore(sessions)


def _save(store: CheckpointStore, version: int, blob: bytes) -> None:
    store.save(version, blob, metrics={}, rows_trained=6, n_total=6, consumed=[])


def _follower(
    sessions, store, bus: FakeRedis | None = None, *, hash_seed: int = 0, max_bytes=None
) -> CheckpointFollower:
    return CheckpointFollower(
        sessions,
        store,
        SnapshotHolder(),
        ServiceMetrics(),
        EXPECT,
        torch.device("cpu"),
        bus,
        hash_seed=hash_seed,
        max_bytes=max_bytes,
    )


def _rejected(follower: CheckpointFollower, reason: str = "invalid") -> float:
    return float(follower._metrics.checkpoint_rejected.labels(reason)._value.get())


def test_model_state_values_are_the_wire_strings() -> None:
    assert [state.value for state in ModelState] == [
        "starting",
        "loaded",
        "cold-start",
        "cold-start: checkpoints refused",
    ]
    assert [state for state in ModelState if state.ready] == [
        ModelState.LOADED,
        ModelState.COLD_START,
    ]


def test_follower_good_hint_reads_neither_redis_nor_the_store(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    bus = FakeRedis({1: one})
    follower = _follower(sessions, store, bus)
    follower.sync(hint=(1, one))
    assert (follower.serving, follower.state) == (1, ModelState.LOADED)
    assert (bus.fetched, store.read) == ([], [])
    assert follower._metrics.checkpoint_swaps._value.get() == 1
    assert follower._metrics.model_version._value.get() == 1


def test_follower_refused_hint_falls_back_to_redis_only(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    bus = FakeRedis({1: one})
    follower = _follower(sessions, store, bus)
    follower.sync(hint=(1, _damaged(one)))
    assert follower.serving == 1
    assert (bus.fetched, store.read) == ([1], [])
    assert _rejected(follower) == 1


def test_follower_refused_hint_and_redis_copy_fall_back_to_the_store(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    bus = FakeRedis({1: _damaged(one)})
    follower = _follower(sessions, store, bus)
    follower.sync(hint=(1, _damaged(one)))
    assert follower.serving == 1
    assert (bus.fetched, store.read) == ([1], [1])
    assert _rejected(follower) == 1  # the same bytes twice: refused and counted once


def test_follower_reads_the_store_when_redis_is_down(sessions, store) -> None:
    _save(store, 1, _blob(1))
    bus = FakeRedis({}, down=True)
    follower = _follower(sessions, store, bus)
    follower.sync()
    assert follower.serving == 1
    assert (bus.fetched, store.read) == ([1], [1])


def test_follower_hint_for_another_version_is_not_used(sessions, store) -> None:
    _save(store, 1, _blob(1))
    _save(store, 2, _blob(2))
    bus = FakeRedis({2: _blob(2)})
    follower = _follower(sessions, store, bus)
    follower.sync(hint=(1, _blob(1)))  # stale: version 2 is the newest
    assert follower.serving == 2
    assert (bus.fetched, store.read) == ([2], [])


def test_follower_load_initial_without_checkpoints_is_a_cold_start(sessions, store) -> None:
    follower = _follower(sessions, store)
    assert follower.state == ModelState.STARTING
    follower.load_initial()
    assert (follower.serving, follower.state) == (0, ModelState.COLD_START)


def test_follower_load_initial_falls_back_to_an_older_checkpoint(sessions, store) -> None:
    _save(store, 1, _blob(1))
    _save(store, 2, _blob(2, hidden=(5,)))  # another network: fails verification
    follower = _follower(sessions, store)
    follower.load_initial()
    assert (follower.serving, follower.state) == (1, ModelState.LOADED)
    assert _rejected(follower) == 1


def test_follower_load_initial_with_every_checkpoint_refused(sessions, store) -> None:
    _save(store, 1, _blob(1, hidden=(5,)))
    follower = _follower(sessions, store)
    follower.load_initial()
    assert (follower.serving, follower.state) == (0, ModelState.REFUSED)
    assert not follower.state.ready


def test_follower_serves_the_pin_and_the_newest_after_unpin(sessions, store) -> None:
    _save(store, 1, _blob(1))
    _save(store, 2, _blob(2))
    follower = _follower(sessions, store)
    follower.sync()
    assert follower.serving == 2
    follower.pin(1)
    follower.sync()
    assert (follower.pinned(), follower.serving) == (1, 1)  # older, but pinned
    follower.unpin()
    follower.sync()
    assert (follower.pinned(), follower.serving) == (None, 2)
    assert repository.get_pin(sessions) is None


def _quarantined(follower: CheckpointFollower) -> float:
    return float(follower._metrics.checkpoints_quarantined._value.get())


def test_follower_quarantines_a_damaged_newest_and_never_reads_it_again(sessions) -> None:
    metrics = ServiceMetrics()
    store = SpyStore(sessions)
    store._metrics = metrics
    _save(store, 1, _blob(1))
    _save(store, 2, _damaged(_blob(2)))  # the row's checksum is the header's: it matches
    follower = CheckpointFollower(
        sessions, store, SnapshotHolder(), metrics, EXPECT, torch.device("cpu"), hash_seed=0
    )
    follower.load_initial()
    assert (follower.serving, follower.state) == (1, ModelState.LOADED)
    assert (_quarantined(follower), store.read) == (1, [2, 1])
    follower.sync()
    follower.load_initial()
    assert store.read == [2, 1]  # version 2 is never asked for again

    bus = FakeRedis({2: _blob(2)})  # the pointer names it, with an intact copy
    other = _follower(sessions, store, bus)
    other.load_initial()
    assert (other.serving, bus.fetched) == (1, [1])  # a quarantined version is not served


def test_follower_with_every_checkpoint_quarantined_is_a_ready_cold_start(sessions, store) -> None:
    _save(store, 1, _damaged(_blob(1)))
    follower = _follower(sessions, store)
    follower.load_initial()
    assert (follower.serving, follower.state) == (0, ModelState.COLD_START)
    assert follower.state.ready  # the trainer starts afresh; nothing servable is refused
    assert repository.get_checkpoint(sessions, 1).quarantined_at is not None


def test_follower_keeps_a_newer_copy_it_serves_when_that_version_is_quarantined(
    sessions, store
) -> None:
    _save(store, 1, _blob(1))
    two = _blob(2)
    _save(store, 2, two)
    follower = _follower(sessions, store)
    follower.sync(hint=(2, two))
    store.quarantine(2, "damaged on disk")  # e.g. found so by the trainer
    store.read.clear()
    follower.sync()
    assert (follower.serving, store.read) == (2, [])  # never back to 1, nothing read


def test_follower_ignores_a_pointer_the_database_lacks_and_reports_it_once(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    bus = FakeRedis({1: one, 1000: _blob(1000)})  # well formed, its own checksum right
    follower = _follower(sessions, store, bus)
    follower.sync()
    follower.sync()
    assert (follower.serving, bus.fetched) == (1, [1])  # version 1000 never downloaded
    assert _rejected(follower, "unrecorded") == 1
    _save(store, 2, _blob(2))
    follower.sync()
    assert follower.serving == 2  # the pointer blocks no later real version


def test_follower_refuses_a_copy_the_database_does_not_record(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    forged = _blob(1, seed=7)  # version 1, other bytes, its own checksum right
    bus = FakeRedis({1: forged})
    follower = _follower(sessions, store, bus)
    follower.sync(hint=(1, forged))
    assert (follower.serving, follower._holder.current.checksum) == (1, store.checksum(one))
    assert (bus.fetched, store.read) == ([1], [1])
    assert _rejected(follower, "mismatch") == 1  # the hint; Redis's same bytes not again


def test_follower_refuses_copies_over_the_limit(sessions, store) -> None:
    one = _blob(1)
    _save(store, 1, one)
    bus = FakeRedis({1: one + bytes(len(one))})  # grew between its STRLEN and its GET
    follower = _follower(sessions, store, bus, max_bytes=len(one))
    follower.sync(hint=(1, one + b"\0"))
    assert (follower.serving, store.read) == (1, [1])
    assert _rejected(follower, "oversized") == 2


def test_follower_never_reads_a_refused_checkpoint_again(sessions, store) -> None:
    other = _blob(1, hidden=(5,))  # another network: every copy is refused
    _save(store, 1, other)
    bus = FakeRedis({1: other})
    follower = _follower(sessions, store, bus)
    follower.load_initial()
    for _ in range(3):  # the poll
        follower.sync()
    assert (follower.serving, follower.state) == (0, ModelState.REFUSED)
    assert (bus.fetched, store.read) == ([1], [1])
    assert _rejected(follower) == 1  # the same bytes in Redis and the store
