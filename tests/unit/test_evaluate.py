"""`rofu evaluate` end to end: the service logs a simulated linear bandit whose policy values
are known, and the IPS, SNIPS and DR intervals cover the truth. The checkpoints here are
stored after the log (none was fitted on it: the served one holds the true means), so
they are evaluated with `--include-training-rows`; what it cannot do is refused."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rofu import cli
from rofu.models import Checkpoint, RegulariserData, RewardNet, Transitions, dump_checkpoint
from rofu.service import migrate
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.settings import Settings, get_settings
from tests.support import app_client

ROUNDS = 1200
ARMS = ["arm-0", "arm-1", "arm-2", "arm-3"]
SUBSET = ["arm-3", "arm-1", "arm-0"]  # every third request offers only these
NOISE = 0.5


class LinearBandit:
    """Rewards b_a + theta_a . x + N(0, NOISE^2) with x ~ N(0, I_4), fixed by a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.theta = self.rng.normal(size=(len(ARMS), 4))  # (A, D)
        self.bias = self.rng.normal(scale=0.5, size=len(ARMS))  # (A,)

    def means(self, x: np.ndarray) -> np.ndarray:
        """(N, D) -> (N, A) expected rewards."""
        return x @ self.theta.T + self.bias

    def reward(self, x: list[float], arm: str, noise: float) -> float:
        """The reward of `arm` for context `x` with a standard normal draw `noise`."""
        return float(self.means(np.array([x]))[0, ARMS.index(arm)] + NOISE * noise)


async def _log_uniformly(
    settings: Settings, bandit: LinearBandit, rounds: int = ROUNDS
) -> list[dict[str, Any]]:
    """`rounds` decisions by the service before any model exists (uniform), all rewarded."""
    contexts = bandit.rng.normal(size=(rounds, 4)).round(6)
    noise = bandit.rng.normal(size=rounds)  # drawn up front: any completion order, same log
    logged: list[dict[str, Any]] = []
    async with app_client(settings) as (client, _):

        async def one(i: int) -> None:
            body: dict[str, Any] = {"context": contexts[i].tolist(), "event_id": f"sim-{i:05d}"}
            if i % 3 == 0:
                body["arms"] = SUBSET
            decision = (await client.post("/v1/select", json=body)).json()
            value = bandit.reward(body["context"], decision["arm"], noise[i])
            reward = {"event_id": decision["event_id"], "value": value}
            response = await client.post("/v1/reward", json=reward)
            assert response.status_code == 200, response.text
            logged.append({**body, "arm": decision["arm"], "propensity": decision["propensity"]})

        for start in range(0, rounds, 50):  # concurrent requests share micro-batches
            await asyncio.gather(*(one(i) for i in range(start, min(start + 50, rounds))))
    return sorted(logged, key=lambda row: row["event_id"])


def _store(settings: Settings, version: int, net: RewardNet, logged: list[dict[str, Any]]) -> None:
    """A checkpoint of `net` whose regulariser sample is the log (as the trainer's would be)."""
    x = torch.tensor([row["context"] for row in logged], dtype=torch.float32)
    arms = torch.tensor([ARMS.index(row["arm"]) for row in logged])
    sample = Transitions(x, arms, torch.zeros(len(logged)))
    counts = torch.bincount(arms, minlength=net.config.n_arms)
    data = RegulariserData(sample, len(logged), counts)
    created = {"created_at": str(time.time())}
    blob = dump_checkpoint(Checkpoint(version, net.config, net.state_dict(), data, extra=created))
    engine = make_engine(settings.database_url)
    try:
        store = CheckpointStore(session_factory(engine), settings.checkpoint_dir)
        n = len(logged)
        store.save(version, blob, metrics={}, rows_trained=n, n_total=n, consumed=[])
    finally:
        engine.dispose()


def _known_model(settings: Settings, bandit: LinearBandit) -> RewardNet:
    """The linear network whose mean is the bandit's expected reward, arm by arm."""
    net = RewardNet(settings.net_config())
    (layer,) = net.layers
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
        layer.weight[: len(ARMS)] = torch.from_numpy(bandit.theta)
        layer.bias[: len(ARMS)] = torch.from_numpy(bandit.bias)
    return net


def linear_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **extra: str
) -> Iterator[Settings]:
    """ROFU_* settings of a linear network on a fresh SQLite file, for the app and the CLI
    (`extra`: more ROFU_* variables)."""
    for name in list(os.environ):
        if name.upper().startswith("ROFU_"):
            monkeypatch.delenv(name)
    env = {
        "ROFU_DATABASE_URL": f"sqlite:///{tmp_path}/rofu.sqlite",
        "ROFU_CONTEXT_DIM": "4",
        "ROFU_HIDDEN": "[]",
        "ROFU_EMBEDDED_TRAINER": "false",
        **extra,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Settings]:
    """ROFU_* settings of a linear network on a fresh SQLite file, for the app and the CLI."""
    yield from linear_environment(monkeypatch, tmp_path)


def _covers(estimate: dict[str, Any], truth: float) -> bool:
    return bool(estimate["ci_low"] <= truth <= estimate["ci_high"])


@pytest.mark.anyio
async def test_evaluate_intervals_cover_the_true_values_of_uniform_and_greedy(
    environment: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, bandit = environment, LinearBandit(seed=7)
    migrate.upgrade(settings.database_url)
    logged = await _log_uniformly(settings, bandit)
    assert {row["propensity"] for row in logged} == {1 / 3, 1 / 4}  # uniform over candidates
    _store(settings, 1, RewardNet(settings.net_config()), logged)  # an older, untrained model
    _store(settings, 2, _known_model(settings, bandit), logged)  # served: the true means

    out = tmp_path / "report"
    args = ["evaluate", "--out", str(out), "--floors", "0.1", "--include-training-rows"]
    assert cli.main(args) == 0
    assert capsys.readouterr().out.strip() == str(out / "evaluate.md")
    figures = json.loads((out / "evaluate.json").read_text())
    assert (out / "evaluate.png").stat().st_size > 1000
    report = (out / "evaluate.md").read_text()
    assert "| greedy v2 | 1200 |" in report
    first = report.splitlines()[0]  # every row was decided before v2 was stored
    assert first.startswith("**Optimistic: --include-training-rows")
    assert (
        f"v2 was fitted on 0 of these {ROUNDS} rows ({ROUNDS} others were decided before" in first
    )

    x = np.array([row["context"] for row in logged])
    means = bandit.means(x)  # (N, A)
    offered = np.array([[arm in row.get("arms", ARMS) for arm in ARMS] for row in logged])
    truth = {
        "uniform": float((np.where(offered, means, 0).sum(1) / offered.sum(1)).mean()),
        "greedy v2": float(np.where(offered, means, -np.inf).max(1).mean()),
    }
    assert figures["rows"] == ROUNDS
    assert set(figures["policies"]) >= {
        "uniform",
        "served v2",
        "greedy v2",
        "served v2, floor 0.1",
        "served v2, bonus x2",
        "checkpoint v1",
    }
    for name, value in truth.items():
        for estimator in ("ips", "snips", "dr"):
            estimate = figures["policies"][name][estimator]
            assert _covers(estimate, value), (name, estimator, estimate, value)
            # and the interval is narrow enough to tell the two policies apart
            half_width = (estimate["ci_high"] - estimate["ci_low"]) / 2
            assert half_width < (truth["greedy v2"] - truth["uniform"]) / 4, (name, estimator)
    assert _covers(figures["logged"], truth["uniform"])  # the log is uniform: on-policy
    assert figures["policies"]["uniform"]["support"] == 1.0


@pytest.mark.parametrize("share", ["1.5", "-0.1", "nan", "most"])
def test_evaluate_refuses_a_minimum_support_outside_0_1(
    environment: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str], share: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["evaluate", "--min-support", share, "--out", str(tmp_path / "report")])
    assert exit_info.value.code == 2
    assert f"--min-support: {share!r}: a share in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


@pytest.mark.anyio
async def test_evaluate_explains_what_it_cannot_do(
    environment: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["evaluate", "--floors", "0.1,2"])
    assert "numbers in [0, 1]" in capsys.readouterr().err
    migrate.upgrade(environment.database_url)
    assert cli.main(["evaluate", "--out", str(tmp_path / "report")]) == 1
    assert "no rewarded decision" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()

    # a checkpoint stored after every logged decision has no fresh row to be evaluated on
    logged = await _log_uniformly(environment, LinearBandit(seed=1), rounds=40)
    _store(environment, 1, RewardNet(environment.net_config()), logged)
    assert cli.main(["evaluate", "--out", str(tmp_path / "report")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "no rewarded decision of the window is fresh for the served checkpoint v1" in error
    assert "0 of the 40 rows were consumed" in error
    assert "wait for decisions after the checkpoint, or pass --include-training-rows" in error
    assert not (tmp_path / "report").exists()
