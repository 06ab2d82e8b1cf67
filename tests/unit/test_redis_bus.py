"""The Redis bus's bounded waits: after a call that could not reach Redis, every call is
skipped for a cool-down, so a Redis that is down or frozen costs one timeout per
cool-down, not one per call. Redis is a closed local port here; the frozen server is in
tests/e2e/test_redis_down.py."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest
import redis

from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle import pinning
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import Cooldown, RedisBus, RedisSkipped
from rofu.service.settings import Settings
from tests.support import free_port, seed_checkpoint


def fail(error: Exception) -> None:
    raise error


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_cooldown_skips_redis_after_a_timeout() -> None:
    clock, calls = Clock(), []

    def frozen() -> None:
        calls.append(clock.now)
        raise redis.TimeoutError("Timeout reading from socket")

    cooldown = Cooldown(seconds=5.0, clock=clock)
    with pytest.raises(redis.TimeoutError):
        cooldown.call(frozen)
    clock.now += 4.9
    with pytest.raises(RedisSkipped, match=r"skipped for 0\.1s more after: Timeout reading"):
        cooldown.call(frozen)
    clock.now += 0.2
    with pytest.raises(redis.TimeoutError):
        cooldown.call(frozen)
    clock.now += 5.1
    answer = cooldown.call(lambda: "PONG")

    assert calls == [50.0, 55.1]  # the skipped call never reached Redis
    assert answer == "PONG"
    assert issubclass(RedisSkipped, redis.ConnectionError)  # callers' except clauses hold


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("Connection refused"), redis.ResponseError("WRONGTYPE")]
)
def test_cooldown_skips_nothing_after_a_failure_that_cost_no_wait(error: Exception) -> None:
    cooldown = Cooldown(seconds=5.0, clock=Clock())
    with pytest.raises(type(error)):
        cooldown.call(lambda: fail(error))
    assert cooldown.call(lambda: 1) == 1


class Silent:
    """A TCP server that accepts connections and reads, and never answers: a frozen
    Redis. `received` counts the reads that brought data (a command each here)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.received = 0
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = self.socket.accept()
                self._connections.append(connection)
                threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while connection.recv(65536):
                self.received += 1

    def close(self) -> None:
        self.socket.close()
        for connection in self._connections:
            connection.close()


def test_redis_bus_frozen_costs_one_timeout_per_cooldown() -> None:
    server, clock = Silent(), Clock()
    bus = RedisBus(f"redis://127.0.0.1:{server.port}/0", timeout_s=0.2, clock=clock)
    skipped = []
    try:
        with pytest.raises(redis.TimeoutError):
            bus.latest_version()
        for call in (
            bus.latest_version,
            lambda: bus.fetch(3),
            lambda: bus.publish(3, b"x"),
            lambda: bus.notify("arms"),
        ):
            with pytest.raises(RedisSkipped) as caught:
                call()
            skipped.append(caught.value)
        answered = bus.ping()
        asked_while_cooling = server.received
        clock.now += 5.1
        with pytest.raises(redis.TimeoutError):
            bus.publish(4, b"y")
    finally:
        bus.close()
        server.close()
    assert len(skipped) == 4
    assert not answered
    assert asked_while_cooling == 1  # only the first call reached the server
    assert server.received > asked_while_cooling  # tried again after the cool-down


def test_redis_bus_down_is_asked_again_by_every_call() -> None:
    bus = RedisBus(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5, clock=Clock())
    errors = []
    try:
        for call in (bus.latest_version, lambda: bus.publish(3, b"x")):
            with pytest.raises(redis.ConnectionError) as caught:
                call()
            errors.append(caught.value)
    finally:
        bus.close()
    assert not any(isinstance(error, RedisSkipped) for error in errors)
    assert all("refused" in str(error) for error in errors)


def test_redis_bus_of_settings_uses_the_timeout_setting() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", redis_timeout_seconds=0.25)
    bus = RedisBus.of(settings)
    try:
        options = bus._client.connection_pool.connection_kwargs
    finally:
        bus.close()
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (0.25, 0.25)
    assert Settings().redis_timeout_seconds == 0.5
    with pytest.raises(ValueError, match="redis_url"):
        RedisBus.of(Settings())


def test_pin_is_stored_when_its_notice_cannot_reach_redis(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/pin.sqlite", context_dim=3)
    seed_checkpoint(settings, n_rows=20)
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    bus = RedisBus(f"redis://127.0.0.1:{free_port()}/0")
    try:
        configs, seed = settings.served_net_configs(), settings.feature_hash_seed
        pinning.pin(sessions, CheckpointStore(sessions), configs, 1, bus, hash_seed=seed)
        pinned = repository.get_pin(sessions)
        pinning.unpin(sessions, bus)
        unpinned = repository.get_pin(sessions)
    finally:
        bus.close()
        engine.dispose()
    assert (pinned, unpinned) == (1, None)  # stored, though no notice reached Redis
    assert "pin notice not sent" in caplog.text
