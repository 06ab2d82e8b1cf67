"""NeuralUCB (Zhou et al. 2020) on the policy's own network, as its official code runs it."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from rofu.models.data import Transitions
from rofu.models.policies.base import check_batch, greedy_decision
from rofu.models.policies.neural import NeuralPolicy
from rofu.models.policies.params import NeuralUCBParams
from rofu.models.scores import Decision, Scores
from rofu.models.training import FitConfig, TrainSchedule

#: NeuralUCB's official code (uclaml/NeuralUCB, train.py and learner_diag.py): one hidden
#: layer of 100, SGD lr 0.01 with weight decay lambda, one row per step, up to 1000 steps;
#: trained every round for the first 2000 rounds, then every 100.
NEURALUCB_SCHEDULE = TrainSchedule(
    every=100,
    dense_until=2000,
    fit=FitConfig(steps=1000, batch_size=1, optimizer="sgd", lr=0.01, weight_decay=1e-3),
)


class NeuralUCB(NeuralPolicy[NeuralUCBParams]):
    """NeuralUCB (Zhou et al. 2020) with the gradient features of the policy's network.

    bonus = sqrt(lam * nu * g^T Z^{-1} g), g = grad_theta f(x, a), Z = lam I + sum g g^T over
    chosen pairs. `z="diag"` keeps only Z's diagonal, as the official code does; `full`
    keeps the P x P inverse (Sherman-Morrison); `auto` is full up to `full_max_params`
    (`NeuralUCBParams`). Defaults lam = 1e-3, nu = 1 and NEURALUCB_SCHEDULE are the
    official code's.
    """

    name = "NeuralUCB"
    Params = NeuralUCBParams
    default_schedule = NEURALUCB_SCHEDULE

    def _setup(self, seed: int) -> None:
        z, n_params = self.params.z, sum(p.numel() for p in self.net.parameters())
        self.full = z == "full" or (z == "auto" and n_params <= self.params.full_max_params)
        dtype = next(self.net.parameters()).dtype
        eye = torch.ones(n_params, dtype=dtype, device=self.device) / self.lam
        self.z_inv = torch.diag(eye) if self.full else eye  # (P, P) or (P,) diagonal

    @property
    def lam(self) -> float:
        """lambda, the ridge of Z."""
        return self.params.lam

    @property
    def nu(self) -> float:
        """The bonus's scale."""
        return self.params.nu

    def gradients(self, x: Tensor, arms: Tensor) -> Tensor:
        """Per-pair gradients of f: (N, *context_shape), (N,) -> (N, P)."""
        params = {k: v.detach() for k, v in self.net.named_parameters()}

        def value(p: dict[str, Tensor], xi: Tensor, ai: Tensor) -> Tensor:
            out: Tensor = functional_call(self.net, p, (xi[None], ai[None], self.arm_features))
            return out[0]

        grads = vmap(grad(value), in_dims=(None, 0, 0))(params, x, arms)
        return torch.cat([grads[k].flatten(1) for k in params], dim=1)

    def bonus(self, contexts: Tensor) -> Tensor:
        """(B, *context_shape) -> (B, A) exploration bonus."""
        batch = contexts.shape[0]
        arms = torch.arange(self.n_arms, device=self.device).repeat(batch)
        g = self.gradients(contexts.repeat_interleave(self.n_arms, 0), arms)  # (B*A, P)
        if self.full:
            width = ((g @ self.z_inv) * g).sum(dim=1)
        else:
            width = (g.square() * self.z_inv).sum(dim=1)
        return (self.lam * self.nu * width.clamp(min=0)).sqrt().view(batch, self.n_arms)

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Argmax of mean + bonus."""
        contexts, mask = self._prepare(contexts, candidates)
        scores = Scores(self.predict(contexts).cpu(), self.bonus(contexts).detach().cpu())
        return greedy_decision(scores, mask, self.generator)

    def update(self, batch: Transitions) -> dict[str, float]:
        """Add g g^T of each chosen pair to Z (at the current theta), then store/refit."""
        check_batch(batch, self.context_shape, self.n_arms)
        dtype = next(self.net.parameters()).dtype
        g = self.gradients(batch.x.to(self.device, dtype), batch.arms.to(self.device))
        for row in g:
            if self.full:
                z_g = self.z_inv @ row  # (P,)
                self.z_inv -= torch.outer(z_g, z_g) / (1.0 + row @ z_g)
            else:
                self.z_inv = 1.0 / (1.0 / self.z_inv + row.square())
        return super().update(batch)
