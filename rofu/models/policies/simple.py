"""Policies without a neural network: Uniform and (disjoint) LinUCB."""

from __future__ import annotations

import torch
from torch import Tensor

from rofu.models.data import Transitions
from rofu.models.policies.base import (
    candidate_mask,
    check_batch,
    check_contexts,
    greedy_decision,
    uniform_decision,
)
from rofu.models.scores import Decision, Scores
from rofu.models.validation import check_float, check_int


class Uniform:
    """Chooses a candidate uniformly at random (the Showdown's `UniformSampling`)."""

    name = "Uniform"

    def __init__(self, context_dim: int, n_arms: int, *, seed: int = 0) -> None:
        self.context_dim = check_int("context_dim", context_dim, low=1)
        self.n_arms = check_int("n_arms", n_arms, low=1)
        self.generator = torch.Generator().manual_seed(check_int("seed", seed, low=0))

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Uniform choice; mean and bonus are zero."""
        contexts = check_contexts(contexts, self.context_dim)
        mask = candidate_mask(candidates, contexts.shape[0], self.n_arms)
        zeros = torch.zeros(mask.shape, dtype=torch.float64)
        return uniform_decision(Scores(zeros, zeros.clone()), mask, self.generator)

    def update(self, batch: Transitions) -> dict[str, float]:
        """Nothing to learn."""
        check_batch(batch, self.context_dim, self.n_arms)
        return {}


class LinUCB:
    """Disjoint LinUCB (Li et al. 2010, Alg. 1): one ridge regression per arm.

    mean = x . theta_a and bonus = alpha * sqrt(x^T A_a^{-1} x), A_a = ridge * I + sum x x^T.
    Defaults alpha = 1, ridge = 1 are the bound ROFU equals with a linear model,
    R = |theta|^2 + |D| MSE and eta = 1/2 (paper, Thm 1). A_a^{-1} is kept in float64
    by Sherman-Morrison updates.
    """

    name = "LinUCB"

    def __init__(
        self,
        context_dim: int,
        n_arms: int,
        *,
        alpha: float = 1.0,
        ridge: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.context_dim = check_int("context_dim", context_dim, low=1)
        self.n_arms = check_int("n_arms", n_arms, low=1)
        self.alpha = check_float("alpha", alpha, low=0.0)
        ridge = check_float("ridge", ridge, low=0.0, low_open=True)
        eye = torch.eye(context_dim, dtype=torch.float64)
        self.a_inv = (eye / ridge).repeat(n_arms, 1, 1)  # (A, D, D)
        self.b = torch.zeros(n_arms, context_dim, dtype=torch.float64)  # (A, D)
        self.generator = torch.Generator().manual_seed(check_int("seed", seed, low=0))

    @property
    def theta(self) -> Tensor:
        """(A, D) ridge estimates A_a^{-1} b_a."""
        return torch.einsum("aij,aj->ai", self.a_inv, self.b)

    def scores(self, contexts: Tensor) -> Scores:
        """(B, D) -> Scores (B, A) in float64."""
        x = contexts.detach().cpu().double()
        mean = x @ self.theta.T  # (B, A)
        width = torch.einsum("bi,aij,bj->ba", x, self.a_inv, x).clamp(min=0)  # (B, A)
        return Scores(mean, self.alpha * width.sqrt())

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Argmax of the LinUCB bound."""
        contexts = check_contexts(contexts, self.context_dim)
        mask = candidate_mask(candidates, contexts.shape[0], self.n_arms)
        return greedy_decision(self.scores(contexts), mask, self.generator)

    def update(self, batch: Transitions) -> dict[str, float]:
        """Rank-one updates of A_a^{-1} and b_a, one row at a time."""
        check_batch(batch, self.context_dim, self.n_arms)
        x, rewards = batch.x.detach().cpu().double(), batch.rewards.detach().cpu().double()
        for row, arm in enumerate(batch.arms.tolist()):
            a_inv_x = self.a_inv[arm] @ x[row]  # (D,)
            self.a_inv[arm] -= torch.outer(a_inv_x, a_inv_x) / (1.0 + x[row] @ a_inv_x)
            self.b[arm] += rewards[row] * x[row]
        return {"rows": float(len(batch))}
