"""The load benchmark's drivers: per concurrency, `wrk` on /select and on the floor, then the
Python client's /select + /reward mix.

The throughput levels (`select_per_s`, p50, p99 of /select, and the same of the trivial
endpoint `/v1/select/validate`, the floor: same middleware and JSON stack, no scoring, no
database) come from `wrk` (`rofu.bench.load_wrk`), so that the generator is not the
bottleneck; the server's metrics are scraped around each /select run for its mean
micro-batch and its own latency histogram. The Python client then plays simulated apps
that reward a share of their decisions: the /reward latency and the acknowledged rewards
the audit checks come from it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable
from typing import TypeVar

import httpx

from rofu.bench.load_report import (
    BATCH_METRIC,
    TARGET_S,
    Level,
    histogram_delta,
    parse_metrics,
    server_count_within,
)
from rofu.bench.load_wrk import run_wrk
from rofu.bench.workload import Workload
from rofu.client import AsyncRofuClient, RofuError

FLOOR_PATH = "/v1/select/validate"


class _Budget:
    def __init__(self, requests: int, seconds: float) -> None:
        self.left, self.deadline = requests, time.perf_counter() + seconds

    def take(self) -> bool:
        if self.left <= 0 or time.perf_counter() >= self.deadline:
            return False
        self.left -= 1
        return True


T = TypeVar("T")


async def _timed(call: Awaitable[T]) -> tuple[float, T | None]:
    """(seconds, the result, or None when the call failed: every failure is an error)."""
    start = time.perf_counter()
    try:
        result = await call
    except RofuError:
        return time.perf_counter() - start, None
    return time.perf_counter() - start, result


async def _client(
    client: AsyncRofuClient, budget: _Budget, level: Level, rng: random.Random, rewards: float
) -> None:
    dim = Workload().context_dim
    while budget.take():
        context = [rng.gauss(0, 1) for _ in range(dim)]
        seconds, decision = await _timed(client.select(context))
        level.select.append(seconds)
        if decision is None:
            level.select_errors += 1
            continue
        level.policies[decision.policy] = level.policies.get(decision.policy, 0) + 1
        if rng.random() < rewards:
            value = rng.gauss(0, 1)
            seconds, stored = await _timed(client.reward(decision.event_id, value))
            level.reward.append(seconds)
            level.reward_errors += int(stored is None)
            if stored is not None:
                level.acked[decision.event_id] = value


async def visit(base_url: str, level: Level, args: argparse.Namespace, rng: random.Random) -> None:
    """The Python client: warm up, then play one share of a level's budget of /select and
    /reward, adding to `level` (its acknowledged rewards are what the audit checks).

    Each of the level's `c` simulated apps has its own client with one keep-alive
    connection, as `c` app instances would: httpcore scans its whole pool on every
    request, so one client with `c` connections costs the load generator O(c) per call
    (measured at c = 64: two thirds of the generator's CPU, which shares the machine with
    the server).
    """
    c = level.concurrency
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    requests, seconds = math.ceil(args.requests / args.rounds), args.seconds / args.rounds
    # No retries: a load test counts every refused or failed call as an error.
    clients = [AsyncRofuClient(base_url, timeout_s=60, retries=0, limits=limits) for _ in range(c)]
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        warm = _Budget(args.warmup, seconds)
        await asyncio.gather(*(_client(client, warm, Level(c), rng, 0.0) for client in clients))
        budget, start = _Budget(requests, seconds), time.perf_counter()
        tasks = (_client(client, budget, level, rng, args.reward_fraction) for client in clients)
        await asyncio.gather(*tasks)
        level.seconds += time.perf_counter() - start


async def wrk_visit(base_url: str, level: Level, args: argparse.Namespace, seed: int) -> None:
    """One share of a level's time on /select, then as long on the floor, both with wrk;
    the server's batch and latency histograms are read around the /select run."""
    seconds, dim, c = args.seconds / args.rounds, Workload().context_dim, level.concurrency
    before = await asyncio.to_thread(_scrape, base_url, args.workers)
    run = await asyncio.to_thread(run_wrk, f"{base_url}/v1/select", c, seconds, dim, seed)
    after = await asyncio.to_thread(_scrape, base_url, args.workers)
    level.wrk_select.runs.append(run)
    floor = await asyncio.to_thread(run_wrk, f"{base_url}{FLOOR_PATH}", c, seconds, dim, seed)
    level.wrk_floor.runs.append(floor)
    batch_sum, batch_count = histogram_delta(before, after, BATCH_METRIC)
    level.batch_sum += batch_sum
    level.batch_count += batch_count
    level.server_selects += server_count_within(before, after, "+Inf")
    level.server_within_target += server_count_within(before, after, f"{TARGET_S}")


def _scrape(base_url: str, workers: int) -> dict[str, float]:
    """The server's metrics; none with several workers (a scrape reaches one of them)."""
    if workers > 1:
        return {}
    return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=30).text)


async def drive(base_url: str, args: argparse.Namespace) -> list[Level]:
    """Every level, `--rounds` times round robin: wrk on /select and the floor, then the
    Python client's mix."""
    levels = [Level(c) for c in args.concurrency]
    for round_ in range(args.rounds):
        for level in levels:
            rng = random.Random(f"{args.seed}/{round_}/{level.concurrency}")
            await wrk_visit(base_url, level, args, rng.randrange(2**31))
            await visit(base_url, level, args, rng)
    return levels
