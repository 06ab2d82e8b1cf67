"""A micro-batcher: concurrent callers' items are gathered and handled in one call.

Like Ray Serve's `_BatchQueue`: an asyncio queue, one future per item, flush when
`max_size` items wait or `max_wait_s` passed since the first, the handler runs off the
event loop (in one worker thread, so batches never overlap), its error reaches every
waiter of that batch, and `aclose()` finishes what was queued before stopping.

With `max_pending`, it holds at most that many items: one more is refused at once
(`Overloaded`) rather than queued behind them. `pending` counts every item accepted and not
yet answered: queued, gathered into the forming batch, or in the batch being handled. An
item whose caller gave up still counts until the batcher reaches it (and skips it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from rofu.service.errors import BatcherClosed, Overloaded

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Gathers items from concurrent `submit` calls into batches for `handler`.

    Args:
        handler: maps a list of items to a list of results of the same length; runs in
            a dedicated worker thread.
        max_size: largest batch.
        max_wait_s: longest time the first item of a batch waits for company; an item
            alone in the batcher (nothing else queued or being handled) does not wait.
        on_batch: called with each batch's size (e.g. a metrics histogram); an error it
            raises fails that batch like a handler error.
        max_pending: most items held at once (`pending`); None: no bound.
        on_shed: called for each item refused past `max_pending` (e.g. a metrics counter).
    """

    def __init__(
        self,
        handler: Callable[[list[T]], Sequence[R]],
        *,
        max_size: int,
        max_wait_s: float,
        on_batch: Callable[[int], None] | None = None,
        max_pending: int | None = None,
        on_shed: Callable[[], None] | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if max_pending is not None and max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._handler = handler
        self._max_size = max_size
        self._max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._max_pending = max_pending
        self._on_shed = on_shed
        self._pending = 0
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]] | None] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rofu-batch")
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Items accepted and not yet answered: queued, gathering, or being handled."""
        return self._pending

    async def submit(self, item: T) -> R:
        """Queue `item` and wait for its result (or its batch's error).

        Raises:
            BatcherClosed: after `aclose()` (a 503 with Retry-After when it reaches HTTP).
            Overloaded: `max_pending` items are already held (a 503 with Retry-After).
        """
        if self._closed:
            raise BatcherClosed()
        if self._max_pending is not None and self._pending >= self._max_pending:
            if self._on_shed is not None:
                self._on_shed()
            raise Overloaded(self._max_pending)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="rofu-micro-batcher")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        self._pending += 1
        return await future

    async def _next(self, timeout: float) -> tuple[T, asyncio.Future[R]] | None:
        """The next queued entry within `timeout` seconds; raises TimeoutError if none."""
        if timeout <= 0:  # wait_for(..., 0) would not take an item that is already queued
            try:
                return self._queue.get_nowait()
            except asyncio.QueueEmpty:
                raise TimeoutError from None
        return await asyncio.wait_for(self._queue.get(), timeout)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            if first is None:  # aclose(): everything queued before it is done
                return
            batch, stopping = [first], False
            # A request alone in the process (nothing else queued or being handled) has no
            # company coming that it knows of: it goes at once rather than wait the window.
            alone = self._pending == 1
            deadline = loop.time() + (0.0 if alone else self._max_wait_s)
            while len(batch) < self._max_size:
                try:
                    entry = await self._next(deadline - loop.time())
                except TimeoutError:
                    break
                if entry is None:
                    stopping = True
                    break
                batch.append(entry)
            await self._flush(batch)
            if stopping:
                return

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            await self._answer(batch)
        finally:  # answered, failed or given up on: the batch's items leave the count
            self._pending -= len(batch)

    async def _answer(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        live = [(item, future) for item, future in batch if not future.done()]
        if not live:
            return
        loop = asyncio.get_running_loop()
        try:
            if self._on_batch is not None:
                self._on_batch(len(live))
            results = await loop.run_in_executor(
                self._executor, self._handler, [item for item, _ in live]
            )
            if len(results) != len(live):
                raise RuntimeError(
                    f"batch handler returned {len(results)} results for {len(live)} items"
                )
        except Exception as exc:  # every waiter of the batch gets the error
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(live, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def aclose(self) -> None:
        """Stop accepting items, finish every queued one, then stop the worker thread."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(None)
            await self._task
        self._executor.shutdown(wait=True)
