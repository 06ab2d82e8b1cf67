"""Bandits for the replay harness: each turns a seed into a `Stream` of T rounds.

A stream holds the context of every round and the reward of *every* arm in it (realised
and expected), drawn once per seed; every policy run on that seed reads the same table,
so policies are compared with common random numbers. Contexts are vectors (D,), or images
(C, H, W) for the ResNet bandit (`Bandit.context_shape`).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rofu.models.resnet import ResNet, ResNetConfig


@dataclass(frozen=True)
class Stream:
    """T rounds of one bandit for one seed.

    Attributes:
        contexts: (T, D) float32 contexts, in the order they arrive ((T, C, H, W) images).
        rewards: (T, A) float64 realised reward each arm would get in each round.
        means: (T, A) float64 expected reward of each arm in each round (for pseudo-regret).
    """

    contexts: np.ndarray
    rewards: np.ndarray
    means: np.ndarray

    def __post_init__(self) -> None:
        rounds = self.contexts.shape[0]
        if self.rewards.shape != self.means.shape or self.rewards.shape[0] != rounds:
            raise ValueError(
                f"stream shapes disagree: contexts {self.contexts.shape}, rewards "
                f"{self.rewards.shape}, means {self.means.shape}"
            )
        for name in ("contexts", "rewards", "means"):
            if not np.isfinite(getattr(self, name)).all():
                raise ValueError(f"stream {name} contain non-finite values")

    @property
    def rounds(self) -> int:
        """T."""
        return int(self.contexts.shape[0])


def rng_for(name: str, seed: int, purpose: str = "stream") -> np.random.Generator:
    """A generator determined by (bandit, seed, purpose) and nothing else."""
    key = zlib.crc32(f"{name}/{purpose}".encode())
    return np.random.default_rng(np.random.SeedSequence([seed, key]))


class Bandit(ABC):
    """A contextual bandit problem."""

    name: str
    context_dim: int  # features of a context (C * H * W for an image)
    n_arms: int
    notes: str = ""

    @property
    def context_shape(self) -> tuple[int, ...]:
        """The shape of one context: (D,), or (C, H, W) for an image bandit."""
        return (self.context_dim,)

    @abstractmethod
    def stream(self, rounds: int, seed: int) -> Stream:
        """The rounds a seed produces (deterministic in (rounds, seed))."""


RewardSampler = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]


class PoolBandit(Bandit):
    """A finite pool of rows; each round draws a row uniformly with replacement.

    Args:
        name: the data set's name.
        contexts: (N, D) features of the pool.
        means: (N, A) expected reward of each arm for each row.
        sample: draws realised rewards (rows (T,), means (T, A), rng) -> (T, A); None
            when rewards are deterministic (realised == expected).
        notes: how the data set was converted, and what of it was available.
    """

    def __init__(
        self,
        name: str,
        contexts: np.ndarray,
        means: np.ndarray,
        sample: RewardSampler | None = None,
        notes: str = "",
    ) -> None:
        if contexts.ndim != 2 or means.ndim != 2 or contexts.shape[0] != means.shape[0]:
            raise ValueError(f"{name}: contexts {contexts.shape} and means {means.shape} disagree")
        if contexts.shape[0] == 0:
            raise ValueError(f"{name}: the pool is empty")
        self.name = name
        self.contexts = np.ascontiguousarray(contexts, dtype=np.float32)
        self.means = np.ascontiguousarray(means, dtype=np.float64)
        self.context_dim, self.n_arms = contexts.shape[1], means.shape[1]
        self._sample = sample
        self.notes = notes

    def stream(self, rounds: int, seed: int) -> Stream:
        rng = rng_for(self.name, seed)
        rows = rng.integers(self.contexts.shape[0], size=rounds)
        means = self.means[rows]
        rewards = means.copy() if self._sample is None else self._sample(rows, means, rng)
        return Stream(self.contexts[rows], rewards, means)


class WheelBandit(Bandit):
    """The Showdown's wheel bandit (Riquelme et al. 2018, section 3.2).

    Contexts are uniform in the unit disk. Inside radius `delta` arm 0 pays N(1.2, 0.01^2)
    and the others N(1.0, 0.01^2); outside it, the arm of the context's quadrant pays
    N(50, 0.01^2), arm 0 N(1.2, 0.01^2) and the rest N(1.0, 0.01^2).
    """

    def __init__(
        self,
        delta: float = 0.95,
        mu_small: float = 1.0,
        mu_medium: float = 1.2,
        mu_large: float = 50.0,
        std: float = 0.01,
    ) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.name, self.context_dim, self.n_arms = "wheel", 2, 5
        self.delta, self.std = delta, std
        self.mu = (mu_small, mu_medium, mu_large)
        self.notes = f"synthetic; delta = {delta}"

    def stream(self, rounds: int, seed: int) -> Stream:
        rng = rng_for(self.name, seed)
        radius = np.sqrt(rng.uniform(size=rounds))  # uniform in the disk
        angle = rng.uniform(0, 2 * np.pi, size=rounds)
        x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
        mu_small, mu_medium, mu_large = self.mu
        means = np.full((rounds, 5), mu_small)
        means[:, 0] = mu_medium
        quadrant = 1 + (x[:, 0] < 0) * 1 + (x[:, 1] < 0) * 2  # arms 1..4 by quadrant
        outside = radius > self.delta
        means[np.flatnonzero(outside), quadrant[outside]] = mu_large
        rewards = means + rng.normal(scale=self.std, size=means.shape)
        return Stream(x.astype(np.float32), rewards, means)


class MLPBandit(Bandit):
    """The paper's MLP bandit (section 5.1): 10-d Gaussian contexts, 10 arms, rewards from
    a random 2-layer MLP (one hidden layer of `hidden` ReLU units, drawn per seed) plus
    N(0, noise^2) noise (the paper's N(0, 0.05), read as a standard deviation)."""

    def __init__(
        self, context_dim: int = 10, n_arms: int = 10, hidden: int = 50, noise: float = 0.05
    ) -> None:
        self.name, self.context_dim, self.n_arms = "mlp", context_dim, n_arms
        self.hidden, self.noise = hidden, noise
        self.notes = f"synthetic; hidden {hidden}, noise std {noise}"

    def stream(self, rounds: int, seed: int) -> Stream:
        net_rng, rng = rng_for(self.name, seed, "network"), rng_for(self.name, seed)
        w1 = net_rng.normal(size=(self.context_dim, self.hidden)) / np.sqrt(self.context_dim)
        w2 = net_rng.normal(size=(self.hidden, self.n_arms)) / np.sqrt(self.hidden)
        x = rng.normal(size=(rounds, self.context_dim))
        means = np.maximum(x @ w1, 0.0) @ w2
        rewards = means + rng.normal(scale=self.noise, size=means.shape)
        return Stream(x.astype(np.float32), rewards, means)


class ResNetBandit(Bandit):
    """The paper's ResNet bandit (section 5.1, Table "MLP and ResNet bandits"), with a
    randomly initialised simulator: no CIFAR-10 can be downloaded here to train one.

    Contexts are 3 x 32 x 32 images of i.i.d. U(-1, 1) pixels (the paper: "Uniform"); the
    expected reward of arm a is the a-th output of a ResNet-`depth` (He-normal weights
    drawn per seed) in eval mode, plus N(0, noise^2) noise (the paper's N(0, 0.5), read as
    a standard deviation like the MLP bandit's). The simulator's batch-norm running
    statistics are set on `calibration` contexts of the same distribution, as a trained
    network's match its inputs (at their initial values, mean 0 and variance 1, the
    outputs grow through the residual stages to +-20); its weights stay random.
    """

    def __init__(
        self,
        depth: int = 20,
        width: int = 16,
        n_arms: int = 10,
        noise: float = 0.5,
        calibration: int = 256,
    ) -> None:
        self.name, self.n_arms = "resnet", n_arms
        self.image = (3, 32, 32)
        self.context_dim = int(np.prod(self.image))
        self.depth, self.width, self.noise, self.calibration = depth, width, noise, calibration
        self.notes = (
            f"synthetic; 3x32x32 U(-1, 1) contexts, a RANDOM ResNet-{depth} (width {width}, "
            f"batch norm calibrated on {calibration} contexts) as simulator, not one trained "
            f"on CIFAR-10; noise std {noise}"
        )

    @property
    def context_shape(self) -> tuple[int, ...]:
        """(3, 32, 32)."""
        return self.image

    def simulator(self, seed: int) -> ResNet:
        """The seed's random ResNet, in eval mode, its batch norm calibrated."""
        draw = rng_for(self.name, seed, "network")
        config = ResNetConfig(
            self.image, self.n_arms, self.depth, self.width, int(draw.integers(2**31))
        )
        net = config.build()
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = None  # a plain average of what it sees
        with torch.no_grad():
            net.train()(
                self._images(draw, self.calibration),
                torch.zeros(self.calibration, dtype=torch.int64),
            )
        return net.eval()

    def _images(self, rng: np.random.Generator, count: int) -> torch.Tensor:
        return torch.from_numpy(
            rng.uniform(-1.0, 1.0, size=(count, *self.image)).astype(np.float32)
        )

    def stream(self, rounds: int, seed: int) -> Stream:
        net, rng = self.simulator(seed), rng_for(self.name, seed)
        x = self._images(rng, rounds)
        with torch.no_grad():
            parts = [net.score_all(x[lo : lo + 250]) for lo in range(0, rounds, 250)]
            means = torch.cat(parts).double().numpy()
        rewards = means + rng.normal(scale=self.noise, size=means.shape)
        return Stream(x.numpy(), rewards, means)


class RotatedBandit(Bandit):
    """A bandit whose rewards drift: from round `at * T` on, arm a pays what arm a + 1
    (mod A) paid, for the same context (a non-stationary bandit for training windows).

    Args:
        base: the stationary bandit whose stream is rotated.
        at: the share of the run after which the arms rotate, in (0, 1).
    """

    def __init__(self, base: Bandit, at: float = 0.5) -> None:
        if not 0.0 < at < 1.0:
            raise ValueError(f"at must be in (0, 1), got {at}")
        self.base = base
        self.at = at
        self.name = f"{base.name}-rotated"
        self.context_dim, self.n_arms = base.context_dim, base.n_arms
        self.notes = (
            f"{base.name}'s stream with its arms rotated by one from round {at:g} T on "
            f"(arm a then pays arm a + 1's reward). {base.notes}"
        ).strip()

    @property
    def context_shape(self) -> tuple[int, ...]:
        return self.base.context_shape

    def stream(self, rounds: int, seed: int) -> Stream:
        stream = self.base.stream(rounds, seed)
        start = int(self.at * rounds)
        rotate = np.roll(np.arange(self.n_arms), -1)  # column a reads arm a + 1
        rewards, means = stream.rewards.copy(), stream.means.copy()
        rewards[start:] = stream.rewards[start:, rotate]
        means[start:] = stream.means[start:, rotate]
        return Stream(stream.contexts, rewards, means)
