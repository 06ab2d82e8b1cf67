"""Array conversions shared by the data set loaders: no file I/O here.

Each turns already-parsed columns into what a `PoolBandit` needs: (N, D) contexts and
(N, A) expected rewards, plus the Mushroom reward coin and the Financial bandit, whose
linear reward model is drawn per seed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rofu.replay.simulation.bandits import Bandit, RewardSampler, Stream, rng_for

DONT_EAT, EAT = 0, 1  # Mushroom arms, in the Showdown's order
EAT_EDIBLE, EAT_POISON_BAD, EAT_POISON_GOOD, P_POISON_BAD = 5.0, -35.0, 5.0, 0.5


def zscore(x: np.ndarray) -> np.ndarray:
    """Columns centred and scaled to unit std (population std); constant columns only centred.

    Args:
        x: (N, D) values.

    Returns:
        (N, D) float64.
    """
    x = np.asarray(x, dtype=np.float64)
    std = x.std(axis=0)
    scaled: np.ndarray = (x - x.mean(axis=0)) / np.where(std == 0, 1.0, std)
    return scaled


def one_hot(frame: pd.DataFrame) -> np.ndarray:
    """One-hot of every column, in column order; within a column the categories that occur,
    sorted (as `pd.get_dummies`). Returns (N, sum of distinct values per column) float64."""
    blocks = []
    for column in frame.columns:
        codes, categories = pd.factorize(frame[column], sort=True)
        if (codes < 0).any():
            raise ValueError(f"column {column!r} has missing values")
        blocks.append(np.eye(len(categories))[codes])
    return np.hstack(blocks)


def label_codes(labels: np.ndarray | pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Arm index of each label by sorted distinct value: ((N,) int codes, (A,) classes)."""
    classes, codes = np.unique(np.asarray(labels), return_inverse=True)
    return codes, classes


def class_means(codes: np.ndarray, n_arms: int) -> np.ndarray:
    """(N, A) rewards of a classification bandit: 1 for the true class's arm, else 0."""
    if codes.min() < 0 or codes.max() >= n_arms:
        raise ValueError(f"labels must lie in [0, {n_arms}), got {codes.min()}..{codes.max()}")
    means = np.zeros((codes.shape[0], n_arms))
    means[np.arange(codes.shape[0]), codes] = 1.0
    return means


def mushroom_means(poisonous: np.ndarray) -> np.ndarray:
    """(N, 2) expected rewards: don't eat 0; eat +5 if edible, else E[+5 or -35] = -15."""
    eat_poison = P_POISON_BAD * EAT_POISON_BAD + (1 - P_POISON_BAD) * EAT_POISON_GOOD
    means = np.zeros((poisonous.shape[0], 2))
    means[:, EAT] = np.where(poisonous, eat_poison, EAT_EDIBLE)
    return means


def mushroom_sampler(poisonous: np.ndarray) -> RewardSampler:
    """Realised rewards: one coin per round decides whether eating a poisonous row harms.

    Args:
        poisonous: (N,) bool over the pool's rows.
    """

    def sample(rows: np.ndarray, means: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        harmed = np.less(rng.random(rows.shape[0]), P_POISON_BAD)  # one coin per round
        rewards = means.copy()  # (T, A)
        hit: np.ndarray = poisonous[rows]
        rewards[hit, EAT] = np.where(harmed[hit], EAT_POISON_BAD, EAT_POISON_GOOD)
        return rewards

    return sample


class FinancialBandit(Bandit):
    """A linear bandit on a fixed pool of contexts (the Showdown's Financial data set).

    For each seed, arm a gets a direction beta_a (uniform in [-1, 1]^D, then scaled to unit
    norm, as the Showdown draws it); its expected reward is x . beta_a and its realised
    reward adds N(0, (noise_scale * (a + 1))^2) noise. Rows are drawn uniformly with
    replacement, as in `PoolBandit`.

    Args:
        contexts: (N, D) pool of contexts, used as they are.
        n_arms: A.
        noise_scale: noise std of arm 0; arm a has (a + 1) times it.
        notes: how the data set was converted.
    """

    def __init__(
        self, contexts: np.ndarray, n_arms: int = 8, noise_scale: float = 0.01, notes: str = ""
    ) -> None:
        if contexts.ndim != 2 or contexts.shape[0] == 0:
            raise ValueError(
                f"financial: contexts must be a non-empty (N, D), got {contexts.shape}"
            )
        self.name = "financial"
        self.contexts = np.ascontiguousarray(contexts, dtype=np.float32)
        self.context_dim, self.n_arms = contexts.shape[1], n_arms
        self.noise_std = noise_scale * np.arange(1, n_arms + 1)  # (A,)
        self.notes = notes

    def betas(self, seed: int) -> np.ndarray:
        """(D, A) unit-norm reward directions of this seed."""
        rng = rng_for(self.name, seed, "beta")
        beta = rng.uniform(-1.0, 1.0, size=(self.context_dim, self.n_arms))
        unit: np.ndarray = beta / np.linalg.norm(beta, axis=0)
        return unit

    def stream(self, rounds: int, seed: int) -> Stream:
        rng = rng_for(self.name, seed)
        rows = rng.integers(self.contexts.shape[0], size=rounds)
        contexts = self.contexts[rows]  # (T, D)
        # the means use the float32 contexts a policy sees, so x . beta holds exactly
        means = contexts.astype(np.float64) @ self.betas(seed)  # (T, A)
        rewards = means + rng.normal(size=means.shape) * self.noise_std
        return Stream(contexts, rewards, means)
