"""HTTP mode: the same stream played against a live service with real /select and
/reward calls. Warm-start rounds force the round-robin arm by sending it as the only
candidate. The service must be configured for the bandit: `context_dim` equal to the
bandit's and exactly `n_arms` active arms; arm i is the active arm with the i-th slot.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from replay.bandits import Bandit, Stream
from replay.simulate import WARM_START, RunResult


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


def service_arms(client: httpx.Client, bandit: Bandit) -> list[str]:
    """The active arm ids in slot order, checked against the bandit's shape."""
    arms = sorted((a for a in client.get("/arms").json() if a["active"]), key=lambda a: a["slot"])
    network = client.get("/model").json()["network"]
    if network["context_dim"] != bandit.context_dim or len(arms) != bandit.n_arms:
        raise ValueError(
            f"the service has context_dim {network['context_dim']} and {len(arms)} active arms;"
            f" {bandit.name} needs {bandit.context_dim} and {bandit.n_arms}"
        )
    return [a["id"] for a in arms]


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
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        arm_ids = service_arms(client, bandit)
        index = {arm_id: i for i, arm_id in enumerate(arm_ids)}
        for t in range(stream.rounds):
            body: dict[str, object] = {
                "context": [float(v) for v in stream.contexts[t]],
                "event_id": f"replay-{bandit.name}-{seed}-{run_id}-{t}",
            }
            if t < warm_start * bandit.n_arms:
                body["arms"] = [arm_ids[t % bandit.n_arms]]
            select_ms[t], decision = _post(client, "/select", body)
            arm = index[decision["arm"]]
            chosen[t] = arm
            reward = {"event_id": body["event_id"], "value": float(stream.rewards[t, arm])}
            reward_ms[t], _ = _post(client, "/reward", reward)
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


def _post(client: httpx.Client, path: str, body: dict[str, object]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    response = client.post(path, json=body)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
    return elapsed, response.json()
