"""The micro-batcher alone: flushing, result routing, errors, cancellation, its bound and
shutdown.

Every wait is bounded by `anyio.fail_after` only as a guard against hangs (a batch that
never flushes); no test asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Sequence

import anyio
import pytest

from rofu.service.deciding.batcher import MicroBatcher
from rofu.service.errors import BatcherClosed, Overloaded

HANG_GUARD_S = 20  # fail instead of hanging when a batch never flushes
FOREVER_S = 120.0  # a max_wait no test reaches: only size or aclose() can flush


class Recorder:
    """A handler that records every batch it sees and maps each item with `fn`."""

    def __init__(self, fn: Callable[[int], object] = lambda x: x * 10) -> None:
        self.fn = fn
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()

    def __call__(self, items: list[int]) -> list[object]:
        self.batches.append(list(items))
        self.threads.add(threading.get_ident())
        return [self.fn(item) for item in items]


async def _settle() -> None:
    """Let every task created so far run up to its first real wait."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_batcher_flushes_on_size() -> None:
    handler = Recorder()
    batcher = MicroBatcher(handler, max_size=4, max_wait_s=FOREVER_S)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(4)))
            assert results == [0, 10, 20, 30]
            assert handler.batches == [[0, 1, 2, 3]]
            more = await asyncio.gather(*(batcher.submit(i) for i in range(10, 18)))
        assert more == [i * 10 for i in range(10, 18)]
        assert handler.batches[1:] == [[10, 11, 12, 13], [14, 15, 16, 17]]
    finally:
        await batcher.aclose()


@pytest.mark.anyio
async def test_batcher_flushes_on_timeout() -> None:
    handler = Recorder()
    batcher = MicroBatcher(handler, max_size=100, max_wait_s=0.02)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            results = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
            assert results == [0, 10, 20]
            assert handler.batches == [[0, 1, 2]]  # handled although 3 < max_size
            assert await batcher.submit(7) == 70  # a lone item is handled too
        assert handler.batches[-1] == [7]
    finally:
        await batcher.aclose()


@pytest.mark.anyio
async def test_batcher_routes_results_to_their_callers() -> None:
    handler = Recorder(lambda x: (x, x * x))
    batcher = MicroBatcher(handler, max_size=16, max_wait_s=0.001)
    items = list(range(300))
    random.Random(7).shuffle(items)

    async def caller(item: int) -> tuple[int, object]:
        for _ in range(item % 3):  # stagger arrivals so batches mix callers unevenly
            await asyncio.sleep(0)
        return item, await batcher.submit(item)

    try:
        with anyio.fail_after(HANG_GUARD_S):
            answers = await asyncio.gather(*(caller(item) for item in items))
    finally:
        await batcher.aclose()
    assert all(result == (item, item * item) for item, result in answers)
    assert sorted(x for batch in handler.batches for x in batch) == sorted(items)
    assert max(len(batch) for batch in handler.batches) <= 16
    assert len(handler.batches) > 1  # really batched, not one item per call or one call


@pytest.mark.anyio
async def test_batcher_runs_handler_off_the_event_loop() -> None:
    started, release = threading.Event(), threading.Event()
    handler_threads: list[int] = []

    def slow(items: list[int]) -> list[bool]:
        handler_threads.append(threading.get_ident())
        started.set()
        # Only a coroutine on the event loop sets `release`: were the handler on the loop,
        # the loop could not run it and the wait would time out with False.
        released = release.wait(HANG_GUARD_S)
        return [released for _ in items]

    batcher: MicroBatcher[int, bool] = MicroBatcher(slow, max_size=1, max_wait_s=0)
    try:
        with anyio.fail_after(HANG_GUARD_S + 5):
            pending = asyncio.create_task(batcher.submit(1))
            while not started.is_set():
                await asyncio.sleep(0.001)
            assert not pending.done()
            release.set()
            assert await pending is True
    finally:
        release.set()
        await batcher.aclose()
    assert handler_threads
    assert threading.get_ident() not in handler_threads


@pytest.mark.anyio
async def test_batcher_fans_handler_error_out_and_keeps_working() -> None:
    def handler(items: list[int]) -> list[int]:
        if -1 in items:
            raise ValueError("bad item in batch")
        return [item + 1 for item in items]

    batcher = MicroBatcher(handler, max_size=3, max_wait_s=FOREVER_S)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            outcomes = await asyncio.gather(
                *(batcher.submit(i) for i in (5, -1, 6)), return_exceptions=True
            )
            assert all(isinstance(o, ValueError) for o in outcomes), outcomes
            assert all(str(o) == "bad item in batch" for o in outcomes)
            assert await asyncio.gather(*(batcher.submit(i) for i in (1, 2, 3))) == [2, 3, 4]
    finally:
        await batcher.aclose()


@pytest.mark.anyio
async def test_batcher_fans_on_batch_error_out_and_keeps_working() -> None:
    calls: list[int] = []

    def on_batch(size: int) -> None:
        calls.append(size)
        if len(calls) == 1:
            raise OSError("metrics backend down")

    batcher = MicroBatcher(Recorder(), max_size=2, max_wait_s=FOREVER_S, on_batch=on_batch)
    try:
        with anyio.fail_after(HANG_GUARD_S):  # a dead batching task would hang here
            outcomes = await asyncio.gather(
                batcher.submit(1), batcher.submit(2), return_exceptions=True
            )
            assert all(isinstance(o, OSError) for o in outcomes), outcomes
            assert await asyncio.gather(batcher.submit(3), batcher.submit(4)) == [30, 40]
    finally:
        await batcher.aclose()
    assert calls == [2, 2]


@pytest.mark.anyio
async def test_batcher_fails_every_waiter_on_wrong_result_count() -> None:
    def short(items: list[int]) -> Sequence[int]:
        return items[:-1]

    batcher = MicroBatcher(short, max_size=3, max_wait_s=FOREVER_S)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            outcomes = await asyncio.gather(
                *(batcher.submit(i) for i in range(3)), return_exceptions=True
            )
    finally:
        await batcher.aclose()
    assert all(isinstance(o, RuntimeError) for o in outcomes), outcomes
    assert all("2 results for 3 items" in str(o) for o in outcomes)


@pytest.mark.anyio
async def test_batcher_skips_a_waiter_cancelled_before_its_batch() -> None:
    started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def held(items: list[int]) -> list[int]:
        batches.append(list(items))
        started.set()
        release.wait(HANG_GUARD_S)
        return [item * 10 for item in items]

    sizes: list[int] = []
    batcher = MicroBatcher(held, max_size=3, max_wait_s=FOREVER_S, on_batch=sizes.append)
    try:
        with anyio.fail_after(HANG_GUARD_S + 5):
            first = asyncio.create_task(batcher.submit(0))  # alone: handled at once, held
            while not started.is_set():
                await asyncio.sleep(0.001)
            gone = asyncio.create_task(batcher.submit(1))  # queued behind the held batch
            await _settle()
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            rest = [asyncio.create_task(batcher.submit(i)) for i in (2, 3)]
            await _settle()
            release.set()
            results = await asyncio.gather(first, *rest)
    finally:
        release.set()
        await batcher.aclose()
    assert results == [0, 20, 30]
    assert batches == [[0], [2, 3]]  # the cancelled item never reached the handler
    assert sizes == [1, 2]


@pytest.mark.anyio
async def test_batcher_does_not_hold_a_lone_item_for_the_window() -> None:
    handler = Recorder()
    batcher = MicroBatcher(handler, max_size=8, max_wait_s=FOREVER_S)
    try:
        with anyio.fail_after(HANG_GUARD_S):  # FOREVER_S would be waited for company
            assert await batcher.submit(1) == 10
            assert await batcher.submit(2) == 20
            together = await asyncio.gather(*(batcher.submit(i) for i in (3, 4, 5, 6, 7, 8, 9, 10)))
    finally:
        await batcher.aclose()
    assert together == [i * 10 for i in range(3, 11)]
    assert handler.batches == [[1], [2], [3, 4, 5, 6, 7, 8, 9, 10]]  # company is still waited for


@pytest.mark.anyio
async def test_batcher_survives_a_waiter_cancelled_during_its_batch() -> None:
    started, release = threading.Event(), threading.Event()

    def blocking(items: list[int]) -> list[int]:
        started.set()
        release.wait(HANG_GUARD_S)
        return [item * 2 for item in items]

    batcher = MicroBatcher(blocking, max_size=3, max_wait_s=FOREVER_S)
    try:
        with anyio.fail_after(HANG_GUARD_S + 5):
            tasks = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, 3)]
            while not started.is_set():
                await asyncio.sleep(0.001)
            tasks[1].cancel()
            release.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert outcomes[0] == 2
            assert isinstance(outcomes[1], asyncio.CancelledError)
            assert outcomes[2] == 6
            assert await asyncio.gather(*(batcher.submit(i) for i in (4, 5, 6))) == [8, 10, 12]
    finally:
        release.set()
        await batcher.aclose()


@pytest.mark.anyio
async def test_batcher_aclose_finishes_queued_items_then_refuses() -> None:
    handler = Recorder()
    sizes: list[int] = []
    batcher = MicroBatcher(handler, max_size=4, max_wait_s=FOREVER_S, on_batch=sizes.append)
    with anyio.fail_after(HANG_GUARD_S):
        tasks = [asyncio.create_task(batcher.submit(i)) for i in range(10)]
        await _settle()
        await batcher.aclose()  # the last 2 items would otherwise wait FOREVER_S
        assert all(task.done() for task in tasks)
        assert [task.result() for task in tasks] == [i * 10 for i in range(10)]
        assert sizes == [4, 4, 2]
        assert [len(batch) for batch in handler.batches] == sizes
        with pytest.raises(BatcherClosed):
            await batcher.submit(99)
        await batcher.aclose()  # idempotent
    assert len(handler.batches) == 3  # nothing was handled after close


@pytest.mark.anyio
async def test_batcher_aclose_without_any_submit() -> None:
    batcher = MicroBatcher(Recorder(), max_size=2, max_wait_s=0.01)
    await batcher.aclose()
    await batcher.aclose()
    with pytest.raises(BatcherClosed, match="shutting down"):
        await batcher.submit(1)


@pytest.mark.anyio
async def test_batcher_reports_each_batch_size() -> None:
    sizes: list[int] = []
    handler = Recorder()
    batcher = MicroBatcher(handler, max_size=5, max_wait_s=FOREVER_S, on_batch=sizes.append)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            await asyncio.gather(*(batcher.submit(i) for i in range(15)))
            await asyncio.gather(*(batcher.submit(i) for i in range(5)))
    finally:
        await batcher.aclose()
    assert sizes == [5, 5, 5, 5]
    assert sizes == [len(batch) for batch in handler.batches]


class Held:
    """A handler that blocks in the worker thread until `release` is set."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.batches: list[list[int]] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.started.set()
        self.release.wait(HANG_GUARD_S)
        return [item * 10 for item in items]


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.001)


@pytest.mark.anyio
async def test_batcher_refuses_past_max_pending_at_once_while_its_batch_is_held() -> None:
    handler, sheds = Held(), []
    batcher = MicroBatcher(
        handler, max_size=2, max_wait_s=0.0, max_pending=3, on_shed=lambda: sheds.append(1)
    )
    try:
        with anyio.fail_after(HANG_GUARD_S + 5):
            first = asyncio.create_task(batcher.submit(1))
            await _until(handler.started.is_set)  # [1] is being handled and held
            queued = [asyncio.create_task(batcher.submit(i)) for i in (2, 3)]
            await _settle()
            assert batcher.pending == 3  # one in the held batch, two queued
            for item in (4, 5):
                with pytest.raises(Overloaded, match="3 requests already wait") as refused:
                    await batcher.submit(item)
                assert refused.value.status_code == 503
                assert refused.value.retry_after == 1
            assert not handler.release.is_set()  # refused while the batch was still held
            assert sheds == [1, 1]
            handler.release.set()
            assert await asyncio.gather(first, *queued) == [10, 20, 30]
            assert batcher.pending == 0
            assert await batcher.submit(6) == 60  # room again
    finally:
        handler.release.set()
        await batcher.aclose()
    assert handler.batches == [[1], [2, 3], [6]]  # the refused items never reached it
    assert batcher.pending == 0


@pytest.mark.anyio
async def test_batcher_counts_a_given_up_item_until_it_reaches_it() -> None:
    handler = Held()
    batcher = MicroBatcher(handler, max_size=2, max_wait_s=0.0, max_pending=2)
    try:
        with anyio.fail_after(HANG_GUARD_S + 5):
            first = asyncio.create_task(batcher.submit(1))
            await _until(handler.started.is_set)
            gone = asyncio.create_task(batcher.submit(2))
            await _settle()
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert batcher.pending == 2  # still queued: the batcher has not reached it
            with pytest.raises(Overloaded):
                await batcher.submit(3)
            handler.release.set()
            assert await first == 10
            await _until(lambda: batcher.pending == 0)  # skipped, then counted out
    finally:
        handler.release.set()
        await batcher.aclose()
    assert handler.batches == [[1]]


@pytest.mark.anyio
async def test_batcher_counts_a_failed_batch_out() -> None:
    def failing(items: list[int]) -> list[int]:
        raise RuntimeError("scoring failed")

    batcher = MicroBatcher(failing, max_size=4, max_wait_s=0.0, max_pending=1)
    try:
        with anyio.fail_after(HANG_GUARD_S):
            for _ in range(3):  # each failure frees its place for the next
                with pytest.raises(RuntimeError, match="scoring failed"):
                    await batcher.submit(1)
                assert batcher.pending == 0
    finally:
        await batcher.aclose()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_size": 4, "max_wait_s": 0.01, "max_pending": 0}, "max_pending"),
        ({"max_size": 4, "max_wait_s": 0.01, "max_pending": -1}, "max_pending"),
        ({"max_size": 0, "max_wait_s": 0.01}, "max_size"),
        ({"max_size": -3, "max_wait_s": 0.01}, "max_size"),
        ({"max_size": 4, "max_wait_s": -0.5}, "max_wait_s"),
    ],
)
def test_batcher_refuses_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MicroBatcher(Recorder(), **kwargs)  # type: ignore[arg-type]
