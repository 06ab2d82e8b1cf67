"""Rivals that explore on any learner: SquareCB (inverse-gap weighting) and NeuralLinUCB.

Both train their network exactly as Greedy does on the same schedule (the base class's
`update` and `train`, the same fit generator), so on one learner the network after the same
rows is the same; they differ from Greedy only in how they choose.

- `SquareCB` (Foster & Rakhlin 2020): inverse-gap weighting of the network's means with
  gamma_t = gamma0 * sqrt(A * t), t the rows seen (the anytime form of their
  gamma = sqrt(A T / log(...)), as VW's `--squarecb` schedules it), zero bonus and the exact
  probability of every candidate.
- `NeuralLinUCB`: LinUCB on the network's last hidden layer phi. Per arm (one shared
  regression for an arm-feature network) A_a = ridge * I + sum phi phi^T over that arm's
  rows, recomputed from every row held whenever the network refits (the features belong to
  the weights) and updated row by row in between. The mean is the network's own (the
  linear head gives the bonus only), so with alpha = 0 it is Greedy; the bonus is
  alpha * sqrt(phi^T A_a^{-1} phi).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rofu.models.data import Transitions
from rofu.models.policies.base import greedy_decision, rofu_decide
from rofu.models.policies.neural import NeuralPolicy, require_mlp
from rofu.models.policies.params import NeuralLinUCBParams, SquareCBParams
from rofu.models.scores import Decision, Scores
from rofu.models.selection import SelectionRule


class SquareCB(NeuralPolicy[SquareCBParams]):
    """Inverse-gap weighting on the network's means (see the module docstring)."""

    name = "SquareCB"
    Params = SquareCBParams

    @property
    def gamma(self) -> float:
        """gamma_t = gamma0 * sqrt(A * t), t = max(1, rows seen)."""
        return self.params.gamma0 * math.sqrt(self.n_arms * max(1, len(self.buffer)))

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Draw from the IGW probabilities of the means; `probabilities` holds them all."""
        contexts, mask = self._prepare(contexts, candidates)
        mean = self.predict(contexts).cpu().double()  # (B, A)
        rule = SelectionRule(selection="igw", igw_gamma=self.gamma)
        return rofu_decide(Scores(mean, torch.zeros_like(mean)), mask, self.generator, rule=rule)


class NeuralLinUCB(NeuralPolicy[NeuralLinUCBParams]):
    """The network's mean plus a LinUCB bonus on its last hidden layer (module docstring)."""

    name = "NeuralLinUCB"
    Params = NeuralLinUCBParams

    def _setup(self, seed: int) -> None:
        self.mlp = require_mlp(self.net, self.name)
        config = self.mlp.config
        groups = self.n_arms if config.per_arm_outputs else 1
        width = (config.hidden or (config.context_dim + config.arm_feature_dim,))[-1]
        eye = torch.eye(width, dtype=torch.float64)
        self.gram = (self.params.ridge * eye).repeat(groups, 1, 1)  # (G, H, H)
        self._inverse: Tensor | None = None

    def features(self, x: Tensor, arms: Tensor) -> Tensor:
        """Last hidden layer of (context, arm) pairs: (N, D), (N,) -> (N, H) float64."""
        dtype = next(self.net.parameters()).dtype
        with torch.no_grad():
            inputs = self.mlp.inputs(
                x.to(self.device, dtype), arms.to(self.device), self.arm_features
            )
            return self.mlp.hidden_features(inputs).double().cpu()

    def _accumulate(self, batch: Transitions) -> None:
        z = self.features(batch.x, batch.arms)  # (N, H)
        if self.gram.shape[0] == 1:
            self.gram[0] += z.T @ z
        else:  # one (H, H) product per arm: never an (N, H, H) tensor
            arms = batch.arms.cpu()
            for arm in sorted(set(arms.tolist())):
                own = z[arms == arm]  # (N_a, H)
                self.gram[arm] += own.T @ own
        self._inverse = None

    def update(self, batch: Transitions) -> dict[str, float]:
        """Store and refit on schedule (as Greedy); then rebuild A_a from every row held
        after a refit, or add the batch's rows to it otherwise."""
        metrics = super().update(batch)
        if metrics.get("trained"):
            eye = torch.eye(self.gram.shape[1], dtype=torch.float64)
            self.gram = (self.params.ridge * eye).repeat(self.gram.shape[0], 1, 1)
            self._accumulate(self.buffer.view())
        else:
            self._accumulate(batch)
        return metrics

    def inverse(self) -> Tensor:
        """(G, H, H) A_a^{-1}, in float64."""
        if self._inverse is None:
            self._inverse = torch.cholesky_inverse(torch.linalg.cholesky(self.gram))
        return self._inverse

    def scores(self, contexts: Tensor) -> Scores:
        """(B, D) -> (B, A) the network's means and alpha * sqrt(phi^T A_a^{-1} phi)."""
        batch = contexts.shape[0]
        mean = self.predict(contexts).cpu().double()  # (B, A)
        if self.gram.shape[0] > 1:  # per-arm regressions on shared features
            z = self.features(contexts, torch.zeros(batch, dtype=torch.long))  # (B, H)
            width = torch.einsum("bi,aij,bj->ba", z, self.inverse(), z)  # (B, A)
        else:
            arms = torch.arange(self.n_arms).repeat(batch)
            pairs = self.features(contexts.repeat_interleave(self.n_arms, 0), arms)
            z = pairs.view(batch, self.n_arms, -1)  # (B, A, H)
            width = torch.einsum("bai,ij,baj->ba", z, self.inverse()[0], z)
        return Scores(mean, self.params.alpha * width.clamp(min=0).sqrt())

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Argmax of mean + bonus, ties uniform; propensity 1 / (tied arms)."""
        contexts, mask = self._prepare(contexts, candidates)
        return greedy_decision(self.scores(contexts), mask, self.generator)
