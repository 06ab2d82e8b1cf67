"""A simulated app with a known reward rule, served through the in-process service and
trained by the real trainer: `rofu evaluate`'s tests know every policy's true value.

Rewards are b_a + theta_a . x + N(0, NOISE^2), x ~ N(0, I_4), fixed by a seed, so a
policy's true value on the logged contexts is sum_a pi(a | x_i) mu_a(x_i) averaged over
the rows. Shared by the SQLite (unit) and Postgres (integration) tests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.bus import NullBus
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.settings import Settings
from tests.support import app_client

ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
DIM = 4
NOISE = 0.5
SUBSET = ["arm-3", "arm-1", "arm-0"]  # every third request offers only these


def service_settings(database_url: str, **extra: Any) -> Settings:
    """A linear network on 4 arms, trained full-batch on whole samples (a checkpoint does
    not depend on the order concurrent decisions were stored in), no background trainer."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "context_dim": DIM,
        "hidden": (),
        "max_arms": len(ARMS),
        "embedded_trainer": False,
        "reward_window_seconds": 0.0,
        "fit_steps": 100,
        "fit_lr": 0.1,
        "fit_batch_size": 100_000,
        "minibatch_size": None,
    }
    return Settings(**(values | extra))


@dataclass(frozen=True)
class Logged:
    """One decision as the app saw it: the context, candidates, the served arm, the
    probability of each candidate, the means the model scored them with and the version."""

    event_id: str
    context: list[float]
    candidates: list[str]
    arm: str
    probabilities: dict[str, float]
    means: dict[str, float | None]
    version: int


class KnownApp:
    """The app's world: per-arm expected rewards linear in the context, fixed by a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.theta = self.rng.normal(size=(len(ARMS), DIM))  # (A, D)
        self.bias = self.rng.normal(scale=0.5, size=len(ARMS))  # (A,)

    def means(self, x: np.ndarray) -> np.ndarray:
        """(N, D) -> (N, A) expected rewards."""
        means: np.ndarray = x @ self.theta.T + self.bias
        return means

    def value(self, rows: list[Logged], policy: np.ndarray) -> float:
        """The true value of a policy's (N, A) probabilities on the rows' contexts."""
        means = self.means(np.array([row.context for row in rows]))
        return float((policy * means).sum(axis=1).mean())

    async def serve(
        self, settings: Settings, prefix: str, n: int, *, flip: bool = False
    ) -> list[Logged]:
        """`n` decisions by the service (every third among `SUBSET`), all rewarded (with
        `flip`, by the negated reward: a poisoned batch)."""
        contexts = self.rng.normal(size=(n, DIM)).round(6)
        noise = self.rng.normal(size=n)  # drawn up front: any completion order, same log
        logged: list[Logged] = []
        async with app_client(settings) as (client, _):

            async def one(i: int) -> None:
                body: dict[str, Any] = {
                    "context": contexts[i].tolist(),
                    "event_id": f"{prefix}-{i:05d}",
                }
                if i % 3 == 0:
                    body["arms"] = SUBSET
                decision = (await client.post("/v1/select", json=body)).json()
                arm = ARMS.index(decision["arm"])
                value = float(self.means(contexts[i : i + 1])[0, arm] + NOISE * noise[i])
                value = -value if flip else value
                reward = {"event_id": decision["event_id"], "value": value}
                assert (await client.post("/v1/reward", json=reward)).status_code == 200
                logged.append(_logged(body, decision))

            for start in range(0, n, 50):  # concurrent requests share micro-batches
                await asyncio.gather(*(one(i) for i in range(start, min(start + 50, n))))
        return sorted(logged, key=lambda row: row.event_id)


def _logged(body: dict[str, Any], decision: dict[str, Any]) -> Logged:
    return Logged(
        event_id=decision["event_id"],
        context=body["context"],
        candidates=body.get("arms", ARMS),
        arm=decision["arm"],
        probabilities={p["arm"]: p["probability"] for p in decision["probabilities"]},
        means={s["arm"]: s["mean"] for s in decision["scores"]},
        version=decision["model_version"],
    )


def train(settings: Settings) -> int:
    """One run of the real trainer on every rewarded decision so far; the new version."""
    engine = make_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        store = CheckpointStore(sessions, settings.checkpoint_dir)
        report = Trainer(settings, sessions, store, NullBus()).run_once()
    finally:
        engine.dispose()
    assert report is not None
    assert report.loss is not None
    return report.version


def served(rows: list[Logged]) -> np.ndarray:
    """(N, A) the probabilities the service logged."""
    return np.array([[row.probabilities.get(arm, 0.0) for arm in ARMS] for row in rows])


def greedy(rows: list[Logged]) -> np.ndarray:
    """(N, A) one-hot on the candidate of the highest logged mean (the deciding model's)."""
    means = np.array([[_mean(row, arm) for arm in ARMS] for row in rows])
    one_hot: np.ndarray = np.eye(len(ARMS))[means.argmax(axis=1)]
    return one_hot


def uniform(rows: list[Logged]) -> np.ndarray:
    """(N, A) uniform over each row's candidates."""
    offered = np.array([[arm in row.candidates for arm in ARMS] for row in rows], dtype=float)
    probabilities: np.ndarray = offered / offered.sum(axis=1, keepdims=True)
    return probabilities


def _mean(row: Logged, arm: str) -> float:
    mean = row.means.get(arm)
    return -np.inf if mean is None else mean
