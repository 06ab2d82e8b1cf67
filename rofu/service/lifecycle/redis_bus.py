"""The checkpoint bus over Redis (production).

The trainer stores each checkpoint durably first, then publishes it here:

    <prefix>:checkpoint:<version>   the checkpoint bytes (the newest `keep` versions)
    <prefix>:checkpoint:latest      the newest version number
    <prefix>:checkpoints            pub/sub channel; a message per new checkpoint or pin

Replicas listen to the channel and poll the pointer as a fallback for missed notices.
Redis is a fast path, never trusted: the database holds every checkpoint, its checksum
and the pin, so a replica serves a copy from Redis only when the database vouches for it
(`rofu.service.lifecycle.copies`), and falls back to the database's copy when Redis is
empty, down or wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rofu.service.lifecycle.checkpoint_store import OversizedCheckpoint

if TYPE_CHECKING:
    from rofu.service.settings import Settings

log = logging.getLogger("rofu.bus")
PIN_NOTICE = "pin"
COOLDOWN_S = 5.0  # how long Redis is skipped after a call to it timed out
#: How long the listener waits on a silent channel before it pings Redis; with no answer
#: one more such wait later, the connection is taken for dead and made anew.
LISTEN_PING_S = 5.0
T = TypeVar("T")


class RedisSkipped(redis.ConnectionError):
    """Redis was not asked: a call to it timed out less than the cool-down ago."""


class Cooldown:
    """Skips Redis for `seconds` after a call that timed out, so a frozen Redis (or one
    behind a host that drops packets) costs one timeout per cool-down, not one per call.
    A refused connection costs nothing and skips nothing: the first call after Redis
    restarts reaches it.

    Args:
        seconds: how long to skip Redis after a timeout.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, seconds: float = COOLDOWN_S, clock: Callable[[], float] = time.monotonic):
        self._seconds = seconds
        self._clock = clock
        self._until = float("-inf")
        self._reason = ""

    def call(self, work: Callable[[], T]) -> T:
        """`work()`, unless a call timed out moments ago.

        Raises:
            RedisSkipped: within the cool-down (a `redis.ConnectionError`).
        """
        left = self._until - self._clock()
        if left > 0:
            raise RedisSkipped(f"skipped for {left:.1f}s more after: {self._reason}")
        try:
            return work()
        except redis.TimeoutError as exc:
            self._reason = str(exc) or type(exc).__name__
            self._until = self._clock() + self._seconds
            raise


class _Client(redis.Redis):
    """A client whose every command goes through its cool-down."""

    cooldown: Cooldown

    def execute_command(self, *args: Any, **options: Any) -> Any:
        command = super().execute_command
        return self.cooldown.call(lambda: command(*args, **options))  # type: ignore[no-untyped-call]


class RedisBus:
    """Publishes checkpoints to Redis and reads them back (blocking calls).

    Every call gives up after `timeout_s` (connecting, sending, each reply; never
    retried), and after a timeout Redis is skipped for `cooldown_s`: the callers fall
    back to the database, which holds everything Redis does.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "rofu",
        keep: int = 10,
        timeout_s: float = 0.5,
        cooldown_s: float = COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        listen_ping_s: float = LISTEN_PING_S,
    ):
        self.url = url
        self.prefix = prefix
        self.keep = keep
        self.channel = f"{prefix}:checkpoints"
        self._timeout_s = timeout_s
        self._listen_ping_s = listen_ping_s
        self._cooldown = Cooldown(cooldown_s, clock)
        client = cast(
            _Client,
            _Client.from_url(  # builds a _Client: from_url is a classmethod
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),  # a retry would double a frozen Redis's cost
            ),
        )
        client.cooldown = self._cooldown
        self._client = client

    @classmethod
    def of(cls, settings: Settings) -> RedisBus:
        """The bus `settings` configure (`redis_url` must be set)."""
        if settings.redis_url is None:
            raise ValueError("redis_url is not set")
        return cls(
            settings.redis_url,
            prefix=settings.redis_prefix,
            timeout_s=settings.redis_timeout_seconds,
        )

    def key(self, version: int) -> str:
        """Where a version's bytes live."""
        return f"{self.prefix}:checkpoint:{version}"

    @property
    def latest_key(self) -> str:
        """The pointer to the newest version."""
        return f"{self.prefix}:checkpoint:latest"

    def publish(self, version: int, blob: bytes) -> None:
        """Store the bytes, move the pointer, announce, and drop versions beyond `keep`."""
        pipe = self._client.pipeline(transaction=True)
        pipe.set(self.key(version), blob)
        pipe.set(self.latest_key, version)
        pipe.publish(self.channel, str(version))
        if version > self.keep:
            pipe.delete(self.key(version - self.keep))
        self._cooldown.call(pipe.execute)

    def notify(self, message: str) -> None:
        """Announce something other than a new checkpoint (e.g. a pin change)."""
        self._client.publish(self.channel, message)

    def latest_version(self) -> int | None:
        """The pointer's version (None when unset); raises redis.RedisError when down."""
        value = self._client.get(self.latest_key)
        return None if value is None else int(value)

    def fetch(self, version: int, max_bytes: int | None = None) -> bytes | None:
        """A version's bytes, or None when Redis no longer holds them.

        Raises:
            OversizedCheckpoint: the value is more than `max_bytes` (STRLEN, before it is
                read); redis.RedisError when Redis is down.
        """
        key = self.key(version)
        if max_bytes is not None:
            size = int(self._client.strlen(key))
            if size > max_bytes:
                raise OversizedCheckpoint(f"checkpoint {version} on Redis", size, max_bytes)
        value = self._client.get(key)
        if value is None:
            return None
        return value if isinstance(value, bytes) else str(value).encode()

    def ping(self) -> bool:
        """Whether Redis answers."""
        try:
            return bool(self._client.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    async def listen(self, on_notice: Callable[[str], Awaitable[None]]) -> None:
        """Call `on_notice(message)` for every notice, forever, reconnecting on failures.

        After each (re)connection it calls `on_notice("connected")` so the caller can catch
        up with whatever it missed while disconnected. A connection that stops answering
        without closing (a Redis host gone, a half-open TCP connection) is found by a ping
        after `listen_ping_s` of silence and replaced within twice that.
        """
        backoff = 0.2
        while True:
            client = aioredis.Redis.from_url(self.url, socket_connect_timeout=self._timeout_s)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    backoff = 0.2
                    await on_notice("connected")
                    async for notice in self._notices(pubsub):
                        await on_notice(notice)
            except (redis.RedisError, OSError) as exc:
                log.warning("checkpoint bus disconnected (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                await client.aclose()

    async def _notices(self, pubsub: aioredis.client.PubSub) -> AsyncIterator[str]:
        """The channel's notices; after `listen_ping_s` of silence a ping, and when that
        goes unanswered for as long again, redis.ConnectionError."""
        pinged = False
        while True:
            message = await pubsub.get_message(timeout=self._listen_ping_s)
            if message is None:
                if pinged:
                    raise redis.ConnectionError(
                        f"no answer from Redis to a ping within {self._listen_ping_s:g}s"
                    )
                await pubsub.ping()
                pinged = True
                continue
            pinged = False
            if message["type"] == "message":
                data = message["data"]
                yield data.decode() if isinstance(data, bytes) else data


def send_notice(bus: RedisBus | None, notice: str, what: str) -> None:
    """Tell the replicas of a stored change now (`RedisBus.notify`); without Redis, or with
    Redis down (logged), they find it at their next poll."""
    if bus is None:
        return
    try:
        bus.notify(notice)
    except redis.RedisError as exc:
        log.warning("%s notice not sent (%s); replicas will poll for it", what, exc)
