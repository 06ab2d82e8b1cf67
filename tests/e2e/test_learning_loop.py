"""The whole loop as real processes: API + trainer on Postgres and Redis, a client that
decides and rewards on a learnable problem, and the model getting better at it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import httpx
import numpy as np
import pytest

from rofu.service import migrate
from tests.support import (
    ROOT,
    require_postgres,
    require_redis,
    reset_postgres,
    service_process,
    stop_process,
)

ARMS = ["red", "green", "blue"]
DIM = 4
CLIENT_KEY = "client-key-0123456789abcdef"


class LinearProblem:
    """Reward of arm a for context x: w_a . x + N(0, 0.1^2); contexts are N(0, I)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.weights = self.rng.normal(size=(len(ARMS), DIM))

    def context(self) -> list[float]:
        return [float(v) for v in self.rng.normal(size=DIM)]

    def best(self, context: list[float]) -> str:
        return ARMS[int(np.argmax(self.weights @ np.asarray(context)))]

    def reward(self, context: list[float], arm: str) -> float:
        mean = float(self.weights[ARMS.index(arm)] @ np.asarray(context))
        return mean + float(self.rng.normal(scale=0.1))


def _env(database_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    return {
        "ROFU_MODE": "production",
        "ROFU_GATE": "off",  # each checkpoint served once stored (test_gate_pg.py: the gate)
        "ROFU_DATABASE_URL": database_url,
        "ROFU_REDIS_URL": redis_url,
        "ROFU_REDIS_PREFIX": prefix,
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_ARMS": "[" + ", ".join(f'{{"id": "{a}"}}' for a in ARMS) + "]",
        "ROFU_MAX_ARMS": str(len(ARMS)),
        "ROFU_HIDDEN": "[32]",
        "ROFU_REWARD_WINDOW_SECONDS": "0",
        "ROFU_TRAIN_EVERY_REWARDS": "25",
        "ROFU_TRAIN_INTERVAL_SECONDS": "2",
        "ROFU_FIT_STEPS": "150",
        "ROFU_FIT_LR": "0.01",
        "ROFU_TRAINER_METRICS_PORT": "0",
        "ROFU_API_KEYS": f'["{CLIENT_KEY}"]',
        "ROFU_ADMIN_API_KEYS": '["admin-key-0123456789abcdef"]',
    }


def _play(client: httpx.Client, problem: LinearProblem, rounds: int) -> list[bool]:
    optimal = []
    for _ in range(rounds):
        context = problem.context()
        chosen = client.post("/v1/select", json={"context": context})
        assert chosen.status_code == 200, chosen.text
        arm = chosen.json()["arm"]
        optimal.append(arm == problem.best(context))
        reward = client.post(
            "/v1/reward",
            json={"event_id": chosen.json()["event_id"], "value": problem.reward(context, arm)},
        )
        assert reward.status_code == 200, reward.text
    return optimal


def _wait_for_version(client: httpx.Client, version: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/v1/model").json()["version"] < version:
        assert time.monotonic() < deadline, f"model version {version} never arrived"
        time.sleep(0.2)


@pytest.fixture
def database_url() -> str:
    url = require_postgres()
    reset_postgres(url)
    migrate.upgrade(url)
    return url


def test_learning_loop_improves_on_a_linear_problem(database_url, tmp_path):
    env = _env(database_url, require_redis(), f"e2e-{uuid.uuid4().hex[:8]}")
    with open(tmp_path / "trainer.log", "wb") as log:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "rofu.service.cli", "trainer"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with (
            service_process(env, tmp_path / "api.log") as base_url,
            httpx.Client(
                base_url=base_url,
                timeout=30,
                headers={"Authorization": f"Bearer {CLIENT_KEY}"},
            ) as client,
        ):
            problem = LinearProblem(seed=3)
            first = _play(client, problem, 150)
            _wait_for_version(client, 1)
            for _ in range(6):  # keep the client and the trainer in step, as in production
                _play(client, problem, 50)
                _wait_for_version(client, client.get("/v1/model").json()["version"] + 1)
            late = _play(client, problem, 200)
            version = client.get("/v1/model").json()["version"]
    finally:
        stop_process(trainer)
        print((tmp_path / "trainer.log").read_text()[-3000:])
    share_late = sum(late) / len(late)
    print(
        f"optimal share: first 150 {sum(first) / 150:.2f}, last 200 {share_late:.2f}, "
        f"model version {version}"
    )
    assert version >= 3
    assert share_late > 0.6, "well above uniform's 1/3"
    assert share_late > sum(first) / len(first)
