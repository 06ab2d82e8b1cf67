"""A replica's bus listener finds a connection that went silent without closing, and
reconnects: notices published after it are heard, not only at the next poll."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from urllib.parse import urlparse

import pytest
import redis

from rofu.service.lifecycle.redis_bus import RedisBus
from tests.support import eventually, require_redis


class FreezingProxy:
    """A TCP proxy to Redis; `freeze()` stops relaying on every open connection without
    closing any (a half-open connection, as behind a host that vanished), while new
    connections relay normally."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.frozen: list[asyncio.Event] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.pipes: list[asyncio.Task[None]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        for event in self.frozen:
            event.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        frozen = asyncio.Event()
        self.frozen.append(frozen)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    if frozen.is_set():
                        await asyncio.Event().wait()  # hold the bytes and the socket
                    dst.write(data)
                    await dst.drain()

        self.pipes += [
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ]

    async def close(self) -> None:
        for task in self.pipes:
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.anyio
async def test_a_silent_connection_is_replaced_and_notices_arrive_again() -> None:
    url = urlparse(require_redis())
    proxy = FreezingProxy(url.hostname or "127.0.0.1", url.port or 6379)
    port = await proxy.start()
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    bus = RedisBus(f"redis://127.0.0.1:{port}/0", prefix=prefix, listen_ping_s=0.3)
    publisher = redis.Redis.from_url(require_redis())
    notices: list[str] = []

    async def on_notice(notice: str) -> None:
        notices.append(notice)

    listener = asyncio.create_task(bus.listen(on_notice))
    try:
        await eventually(lambda: notices == ["connected"], timeout=10)
        publisher.publish(bus.channel, "v1")
        await eventually(lambda: notices == ["connected", "v1"], timeout=10)

        proxy.freeze()
        publisher.publish(bus.channel, "lost")  # held by the frozen connection
        # one ping after 0.3 s of silence, no answer within 0.3 s more, then a new
        # connection after the 0.2 s back-off (the old listener waited for good)
        await eventually(lambda: notices[-1] == "connected", timeout=10)

        publisher.publish(bus.channel, "v2")
        await eventually(lambda: notices[-1] == "v2", timeout=10)
        assert "lost" not in notices
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await proxy.close()
        publisher.close()
        bus.close()


@pytest.mark.anyio
async def test_a_quiet_but_live_channel_keeps_its_one_connection() -> None:
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    bus = RedisBus(require_redis(), prefix=prefix, listen_ping_s=0.1)
    notices: list[str] = []

    async def on_notice(notice: str) -> None:
        notices.append(notice)

    listener = asyncio.create_task(bus.listen(on_notice))
    try:
        await eventually(lambda: notices == ["connected"], timeout=10)
        await asyncio.sleep(1.5)  # fifteen pings answered
        assert notices == ["connected"]
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        bus.close()
