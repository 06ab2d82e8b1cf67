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
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aioredis

from rofu.service.lifecycle.checkpoint_store import OversizedCheckpoint

log = logging.getLogger("rofu.bus")
PIN_NOTICE = "pin"


class RedisBus:
    """Publishes checkpoints to Redis and reads them back (blocking calls)."""

    def __init__(self, url: str, prefix: str = "rofu", keep: int = 10, timeout_s: float = 5.0):
        self.url = url
        self.prefix = prefix
        self.keep = keep
        self.channel = f"{prefix}:checkpoints"
        self._timeout_s = timeout_s
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
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
        pipe.execute()

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
        up with whatever it missed while disconnected.
        """
        backoff = 0.2
        while True:
            client = aioredis.Redis.from_url(self.url, socket_connect_timeout=self._timeout_s)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(self.channel)
                    backoff = 0.2
                    await on_notice("connected")
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            data = message["data"]
                            await on_notice(data.decode() if isinstance(data, bytes) else data)
            except (redis.RedisError, OSError) as exc:
                log.warning("checkpoint bus disconnected (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                await client.aclose()
