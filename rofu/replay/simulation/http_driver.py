"""HTTP mode: the same stream played against a live service with real /select and
/reward calls. Warm-start rounds force the round-robin arm by sending it as the only
candidate. The service must be configured for the bandit: `context_dim` equal to the
bandit's and exactly `n_arms` active arms; arm i is the active arm with the i-th slot.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import numpy as np

from rofu.client import RofuClient
from rofu.replay.simulation.bandits import Bandit, Stream
from rofu.replay.simulation.simulate import WARM_START, RunResult


@dataclass(frozen=True)
class HttpRun:
    """A run's result and its request latencies (seconds)."""

    result: RunResult
    select_latency: np.ndarray  # (T,)
    reward_latency: np.ndarray  # (T,)

    def percentiles(self) -> dict[str, float]:
        """p50 / p99 of both endpoints, in milliseconds."""
        return {
            f"{name}_{label}_ms": float(1000 * np.percentile(values, q))
            for name, values in (("select", self.select_latency), ("reward", self.reward_latency))
            for label, q in (("p50", 50), ("p99", 99))
        }


def service_arms(client: RofuClient, bandit: Bandit) -> list[str]:
    """The active arm ids in slot order, checked against the bandit's shape."""
    arms = sorted((a for a in client.arms() if a.active), key=lambda a: a.slot)
    network = client.model().network
    if network["context_dim"] != bandit.context_dim or len(arms) != bandit.n_arms:
        raise ValueError(
            f"the service has context_dim {network['context_dim']} and {len(arms)} active arms;"
            f" {bandit.name} needs {bandit.context_dim} and {bandit.n_arms}"
        )
    return [a.id for a in arms]


def serve_command(bandit: Bandit) -> str:
    """The command that starts an embedded service shaped for `bandit` (a fresh database:
    arms that exist already stay active)."""
    arms = json.dumps([{"id": f"arm-{i}"} for i in range(bandit.n_arms)], separators=(",", ":"))
    return (
        f"ROFU_DATABASE_URL=sqlite:///var/{bandit.name.replace(':', '-')}.sqlite "
        f"ROFU_CONTEXT_DIM={bandit.context_dim} ROFU_MAX_ARMS={bandit.n_arms} "
        f"ROFU_ARMS='{arms}' rofu serve"
    )


def play(
    url: str,
    bandit: Bandit,
    stream: Stream,
    seed: int,
    *,
    warm_start: int = WARM_START,
    timeout_s: float = 30.0,
) -> HttpRun:
    """Play `stream` against the service at `url`."""
    run_id = uuid.uuid4().hex[:12]
    select_ms, reward_ms = np.zeros(stream.rounds), np.zeros(stream.rounds)
    chosen = np.empty(stream.rounds, dtype=np.int64)
    started = time.perf_counter()
    with RofuClient(url, timeout_s=timeout_s) as client:
        arm_ids = service_arms(client, bandit)
        index = {arm_id: i for i, arm_id in enumerate(arm_ids)}
        for t in range(stream.rounds):
            event_id = f"replay-{bandit.name}-{seed}-{run_id}-{t}"
            warm = [arm_ids[t % bandit.n_arms]] if t < warm_start * bandit.n_arms else None
            context = [float(v) for v in stream.contexts[t]]
            start = time.perf_counter()
            decision = client.select(context, event_id=event_id, arms=warm)
            select_ms[t] = time.perf_counter() - start
            arm = index[decision.arm]
            chosen[t] = arm
            start = time.perf_counter()
            client.reward(event_id, float(stream.rewards[t, arm]))
            reward_ms[t] = time.perf_counter() - start
    rows = np.arange(stream.rounds)
    result = RunResult(
        bandit.name,
        "service",
        seed,
        chosen,
        stream.rewards.max(axis=1) - stream.rewards[rows, chosen],
        stream.means.max(axis=1) - stream.means[rows, chosen],
        time.perf_counter() - started,
    )
    return HttpRun(result, select_ms, reward_ms)
