"""Regret II, the ROFU paper's reported metric: regret against a network trained offline.

The paper (appendix "Experimental details") trains theta' by minimising the squared error
over every arm of a full-information data set and reports
R_T(II) = E sum_t r(x_t, a'_t) - E sum_t r(x_t, a_t), a'_t = argmax_a f_theta'(x_t, a): the
expected reward of the oracle's choice minus that of the policy's, both read off the
stream's expected rewards (so, like pseudo-regret, it has no reward noise; it can be
negative where the policy beats the oracle).

The oracle is an MLP trained once, deterministically (its seed, Adam, fixed minibatches),
on the expected rewards of every arm of:
- a pool bandit's whole pool (one oracle per data set, every seed reads it);
- for a generated bandit (the wheel, the MLP bandit, Financial: their reward function is
  drawn per seed), the run's own stream, T contexts x A arms, the paper's virtual data set
  of T contexts (it is not an independent draw: the oracle sees the contexts it is
  scored on, as a pool's oracle does).
Image bandits get none. Trained oracles are cached as safetensors under the study's
git-ignored `cache/oracle/`, named by data set (and seed and T) and a hash of the recipe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rofu.models.networks import RewardNet, RewardNetConfig
from rofu.models.validation import check_float, check_int
from rofu.replay.simulation.bandits import Bandit, PoolBandit, Stream


@dataclass(frozen=True)
class OracleConfig:
    """How the oracle is trained: the product's MLP shape, Adam, minibatches of rows (each
    row's every arm), `steps` updates but at most `max_epochs` passes over the rows."""

    hidden: tuple[int, ...] = (100,)
    lr: float = 1e-3
    batch_size: int = 512
    steps: int = 2000
    max_epochs: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        check_float("lr", self.lr, low=0.0, low_open=True)
        for name in ("batch_size", "steps", "max_epochs"):
            check_int(name, getattr(self, name), low=1)
        check_int("seed", self.seed, low=0)

    @property
    def tag(self) -> str:
        """A short hash of the recipe (a cached oracle of another recipe is not reused)."""
        return hashlib.sha256(json.dumps(asdict(self)).encode()).hexdigest()[:10]


ORACLE = OracleConfig()


def training_data(bandit: Bandit, stream: Stream) -> tuple[np.ndarray, np.ndarray, str]:
    """(contexts (N, D), expected rewards (N, A), the cache name) the oracle learns from."""
    if isinstance(bandit, PoolBandit):
        return bandit.contexts, bandit.means, bandit.name
    return stream.contexts, stream.means, ""


def train_oracle(contexts: np.ndarray, means: np.ndarray, config: OracleConfig) -> RewardNet:
    """An MLP fitted to every arm's expected reward by minibatch Adam, deterministically.

    Args:
        contexts: (N, D) float contexts.
        means: (N, A) expected rewards.
        config: the recipe.
    """
    x = torch.from_numpy(np.ascontiguousarray(contexts, dtype=np.float32))  # (N, D)
    y = torch.from_numpy(np.ascontiguousarray(means, dtype=np.float32))  # (N, A)
    net_config = RewardNetConfig(
        context_dim=x.shape[1], n_arms=y.shape[1], hidden=config.hidden, seed=config.seed
    )
    net = RewardNet(net_config)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    batch = min(config.batch_size, x.shape[0])
    per_epoch = -(-x.shape[0] // batch)
    for _ in range(min(config.steps, config.max_epochs * per_epoch)):
        rows = torch.randint(x.shape[0], (batch,), generator=generator)
        loss = (net.score_all(x[rows]) - y[rows]).square().mean()
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return net.eval()


def oracle_for(
    bandit: Bandit, stream: Stream, seed: int, config: OracleConfig, cache: Path | None
) -> RewardNet | None:
    """The bandit's oracle (None for an image bandit), from `cache` when trained before."""
    if len(bandit.context_shape) != 1:
        return None
    contexts, means, name = training_data(bandit, stream)
    name = name or f"{bandit.name}-seed{seed}-T{stream.rounds}"
    path = None if cache is None else cache / f"{name}-{config.tag}.safetensors"
    if path is not None and path.is_file():
        net_config = RewardNetConfig(
            context_dim=contexts.shape[1], n_arms=means.shape[1], hidden=config.hidden
        )
        net = RewardNet(net_config)
        net.load_state_dict(load_file(path))
        return net.eval()
    net = train_oracle(contexts, means, config)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(partial))
        partial.replace(path)
    return net


def regret_two(oracle: RewardNet, stream: Stream, arms: np.ndarray) -> np.ndarray:
    """(T,) per-round regret II: mu_t(a'_t) - mu_t(a_t), a'_t the oracle's argmax (the
    first arm among ties)."""
    with torch.no_grad():
        predicted = oracle.score_all(torch.from_numpy(stream.contexts)).double().numpy()
    rows = np.arange(stream.rounds)
    best = predicted.argmax(axis=1)  # (T,)
    regret: np.ndarray = stream.means[rows, best] - stream.means[rows, arms]
    return regret
