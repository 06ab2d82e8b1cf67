"""A deadline on a request's wait for the database, whatever the server does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from rofu.service.errors import Unavailable

T = TypeVar("T")


async def within(seconds: float, work: Awaitable[T]) -> T:
    """`work`'s result, or a 503 `Unavailable` once `seconds` have passed.

    Work already handed to a thread still finishes; every write it can make is keyed by
    the request's event_id, so the client's retry finds it instead of making a second.
    """
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        raise Unavailable(
            f"the database did not answer within {seconds:g} s "
            "(ROFU_REQUEST_DEADLINE_SECONDS); retry with the same event_id",
            cause="timeout",
        ) from None
