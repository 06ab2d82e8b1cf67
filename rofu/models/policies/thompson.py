"""Thompson-sampling baselines of the Deep Bayesian Bandits Showdown (Riquelme et al. 2018).

Each scores mean + bonus where bonus is one posterior draw minus the mean, and chooses
the argmax of the draw. Defaults are the Showdown's `example_main.py` hyper-parameters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, vmap

from rofu.models.data import Transitions
from rofu.models.networks import RewardNet, RewardNetConfig
from rofu.models.policies.base import check_batch, greedy_decision, masked, sampled_propensity
from rofu.models.policies.neural import NeuralPolicy, require_mlp
from rofu.models.policies.params import (
    BootstrapParams,
    DropoutParams,
    NeuralLinearParams,
    ParamNoiseParams,
    ThompsonParams,
)
from rofu.models.reward_model import RewardModelConfig
from rofu.models.scores import Decision, Scores
from rofu.models.training import fit

ThompsonParamsT = TypeVar("ThompsonParamsT", bound=ThompsonParams)


class _Thompson(NeuralPolicy[ThompsonParamsT]):
    """Shared select: argmax of one draw, propensity by `propensity_samples` re-draws."""

    @property
    def propensity_samples(self) -> int:
        """Extra posterior draws per decision that estimate its propensity."""
        return self.params.propensity_samples

    def draw(self, contexts: Tensor) -> Tensor:
        """One posterior draw of the (B, A) scores."""
        raise NotImplementedError

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Thompson choice with a Monte Carlo propensity (see `sampled_propensity`)."""
        contexts, mask = self._prepare(contexts, candidates)
        mean = self.predict(contexts).cpu()
        sample = self.draw(contexts).detach().cpu()
        decision = greedy_decision(Scores(mean, sample - mean), mask, self.generator)
        propensity = sampled_propensity(
            lambda: self.draw(contexts).detach().cpu(),
            decision.arms,
            mask,
            self.propensity_samples,
            self.generator,
        )
        return Decision(decision.arms, propensity, decision.scores)


class NeuralLinear(_Thompson[NeuralLinearParams]):
    """Bayesian linear regression on the network's last hidden layer (Showdown).

    Per arm (one shared regression for an arm-feature network), a normal-inverse-gamma
    posterior: precision S + lambda_prior I, sigma^2 ~ InvGamma(a0 + n/2, b0 + ...). The
    regression is refreshed every round; the network on the schedule (features of all
    data are recomputed after each refit). `NeuralLinearParams`: a0 = b0 = 6,
    lambda_prior = 0.25.
    """

    name = "NeuralLinear"
    Params = NeuralLinearParams

    def _setup(self, seed: int) -> None:
        self.mlp = require_mlp(self.net, self.name)  # the network itself, as an MLP
        self.rng = np.random.default_rng(seed)
        config = self.mlp.config
        groups = self.n_arms if config.per_arm_outputs else 1
        width = (config.hidden or (config.context_dim + config.arm_feature_dim,))[-1]
        self.zz = torch.zeros(groups, width, width, dtype=torch.float64)  # (G, H, H)
        self.zy = torch.zeros(groups, width, dtype=torch.float64)  # (G, H)
        self.yy = torch.zeros(groups, dtype=torch.float64)
        self.n = torch.zeros(groups, dtype=torch.float64)
        self._posterior: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def features(self, x: Tensor, arms: Tensor) -> Tensor:
        """Last hidden layer of (context, arm) pairs: (N, D), (N,) -> (N, H) float64."""
        with torch.no_grad():
            inputs = self.mlp.inputs(x, arms.to(self.device), self.arm_features)
            return self.mlp.hidden_features(inputs).double().cpu()

    def _accumulate(self, batch: Transitions) -> None:
        dtype = next(self.net.parameters()).dtype
        z = self.features(batch.x.to(self.device, dtype), batch.arms)  # (N, H)
        y = batch.rewards.detach().cpu().double()
        group = batch.arms.cpu() if self.zz.shape[0] > 1 else torch.zeros_like(batch.arms)
        self.zz.index_add_(0, group, z[:, :, None] * z[:, None, :])
        self.zy.index_add_(0, group, z * y[:, None])
        self.yy.index_add_(0, group, y.square())
        self.n.index_add_(0, group, torch.ones_like(y))
        self._posterior = None

    def update(self, batch: Transitions) -> dict[str, float]:
        """Refresh the regression with the batch; refit the network on schedule."""
        metrics = super().update(batch)
        if metrics.get("trained"):
            for stat in (self.zz, self.zy, self.yy, self.n):
                stat.zero_()
            self._accumulate(self.buffer.view())
        else:
            self._accumulate(batch)
        return metrics

    def posterior(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Per group: mean (G, H), Cholesky of the covariance (G, H, H), a (G,), b (G,)."""
        if self._posterior is None:
            eye = torch.eye(self.zz.shape[1], dtype=torch.float64)
            precision = self.zz + self.params.lambda_prior * eye  # (G, H, H)
            cov = torch.linalg.inv(precision)
            cov = 0.5 * (cov + cov.transpose(1, 2))
            mu = torch.einsum("gij,gj->gi", cov, self.zy)  # (G, H)
            quad = torch.einsum("gi,gij,gj->g", mu, precision, mu)
            a = self.params.a0 + self.n / 2
            b = self.params.b0 + 0.5 * (self.yy - quad).clamp(min=0)
            self._posterior = (mu, torch.linalg.cholesky(cov), a, b)
        return self._posterior

    def _pair_features(self, contexts: Tensor) -> Tensor:
        batch = contexts.shape[0]
        if self.zz.shape[0] > 1:  # per-arm regressions on shared features
            return self.features(contexts, torch.zeros(batch, dtype=torch.long))[:, None, :]
        arms = torch.arange(self.n_arms).repeat(batch)
        pairs = contexts.repeat_interleave(self.n_arms, 0)
        return self.features(pairs, arms).view(batch, self.n_arms, -1)  # (B, A, H)

    def predict(self, contexts: Tensor) -> Tensor:
        """(B, D) -> (B, A) posterior-mean rewards."""
        mu = self.posterior()[0]
        return self._scores(self._pair_features(contexts), mu[None].expand(len(contexts), -1, -1))

    def draw(self, contexts: Tensor) -> Tensor:
        """One posterior draw of (B, A) rewards; each context gets its own draw."""
        mu, chol, a, b = self.posterior()
        batch, groups, width = contexts.shape[0], mu.shape[0], mu.shape[1]
        sigma2 = b.numpy() / self.rng.gamma(a.numpy(), size=(batch, groups))  # InvGamma
        eps = torch.from_numpy(self.rng.standard_normal((batch, groups, width)))
        beta = mu + torch.from_numpy(np.sqrt(sigma2))[..., None] * torch.einsum(
            "gij,bgj->bgi", chol, eps
        )  # (B, G, H)
        return self._scores(self._pair_features(contexts), beta)

    def _scores(self, z: Tensor, beta: Tensor) -> Tensor:
        # z (B, 1 or A, H) and beta (B, A or 1, H) broadcast to (B, A).
        return (z * beta).sum(dim=-1)


class Bootstrap(NeuralPolicy[BootstrapParams]):
    """Bootstrapped ensemble (Showdown `BootRMS`): q networks, each trained on the rows it
    drew with probability p; each decision follows one network picked uniformly.
    `BootstrapParams`: q = 3, p = 0.95. The propensity is exact.
    """

    name = "Bootstrap"
    Params = BootstrapParams

    def _setup(self, seed: int) -> None:
        self.mlp = require_mlp(self.net, self.name)
        config = self.mlp.config
        self.members = [self.mlp] + [
            RewardNet(dataclasses.replace(config, seed=config.seed + i)).to(self.device).eval()
            for i in range(1, self.params.q)
        ]
        self.inclusion = torch.zeros(0, self.params.q, dtype=torch.bool)  # (N, q)

    def member_scores(self, contexts: Tensor) -> Tensor:
        """(B, D) -> (q, B, A) predictions of every member."""
        with torch.no_grad():
            return torch.stack([m.score_all(contexts, self.arm_features) for m in self.members])

    def predict(self, contexts: Tensor) -> Tensor:
        """(B, D) -> (B, A) ensemble-mean rewards."""
        return self.member_scores(contexts).mean(dim=0)

    def select(self, contexts: Tensor, candidates: Tensor | None = None) -> Decision:
        """Follow a uniformly chosen member; propensity averages the members' argmaxes."""
        contexts, mask = self._prepare(contexts, candidates)
        scores = self.member_scores(contexts).cpu()  # (q, B, A)
        q, batch = scores.shape[0], scores.shape[1]
        member = torch.randint(q, (batch,), generator=self.generator)
        chosen = scores[member, torch.arange(batch)]  # (B, A)
        mean = scores.mean(dim=0)
        decision = greedy_decision(Scores(mean, chosen - mean), mask, self.generator)
        propensity = torch.zeros(batch, dtype=torch.float64)
        for i in range(q):
            values = scores[i].double().masked_fill(~mask, float("-inf"))
            ties = (values == values.max(dim=1, keepdim=True).values) & mask
            hit = ties.gather(1, decision.arms[:, None]).squeeze(1).double()
            propensity += hit / ties.sum(dim=1).double() / q
        return Decision(decision.arms, propensity, masked(decision.scores, mask))

    def update(self, batch: Transitions) -> dict[str, float]:
        """Draw each row's membership, store; refit every member on schedule."""
        check_batch(batch, self.context_shape, self.n_arms)  # a rejected batch draws nothing
        draws = torch.rand(len(batch), len(self.members), generator=self.generator) < self.params.p
        self.inclusion = torch.cat([self.inclusion, draws])
        return super().update(batch)

    def train(self) -> dict[str, float]:
        """Refit each member on its own bootstrap rows."""
        data, losses = self.buffer.view(), []
        for i, member in enumerate(self.members):
            rows = self.inclusion[:, i].nonzero().flatten().to(self.device)
            if rows.numel():
                metrics = fit(
                    member,
                    data.subset(rows),
                    self.schedule.fit,
                    self.fit_generator,
                    arm_features=self.arm_features,
                    optimizer=self.optimizer_for(member),
                )
                losses.append(metrics["loss"])
        return {"loss": sum(losses) / max(len(losses), 1), "rows": float(len(data))}


class Dropout(_Thompson[DropoutParams]):
    """MC-dropout Thompson sampling (Showdown `Dropout`): trained with dropout, and each
    decision takes the argmax of one dropout-perturbed forward pass. `DropoutParams`:
    keep 0.8.
    """

    name = "Dropout"
    Params = DropoutParams

    def _net_config(self, config: RewardModelConfig) -> RewardModelConfig:
        if not isinstance(config, RewardNetConfig):
            raise TypeError(
                f"net_config must be a RewardNetConfig for Dropout, got {type(config).__name__}"
            )
        return dataclasses.replace(config, dropout=1.0 - self.params.keep_prob)

    def _setup(self, seed: int) -> None:
        self.mlp = require_mlp(self.net, self.name)
        self.dropout_generator = torch.Generator(device=self.device).manual_seed(seed + 7)

    def draw(self, contexts: Tensor) -> Tensor:
        """One dropout forward pass: (B, D) -> (B, A)."""
        with torch.no_grad():
            return self.mlp.score_all(contexts, self.arm_features, self.dropout_generator)

    def train(self) -> dict[str, float]:
        """Refit with dropout masks."""
        return fit(
            self.mlp,
            self.buffer.view(),
            self.schedule.fit,
            self.fit_generator,
            arm_features=self.arm_features,
            dropout_generator=self.dropout_generator,
            optimizer=self.optimizer_for(self.mlp),
        )


class ParamNoise(_Thompson[ParamNoiseParams]):
    """Parameter-noise sampling (Plappert et al. 2018; Showdown `ParamNoise`).

    Each decision perturbs every weight with N(0, noise_std^2). After each refit the noise
    adapts: x1.01 if the KL between softmax(predictions) with and without noise on
    `d_samples` stored contexts is below -log(1 - eps + eps / A), else /1.01; eps *= 0.99.
    `ParamNoiseParams`: noise_std 0.05, eps 0.1, d_samples 300 to start.
    """

    name = "ParamNoise"
    Params = ParamNoiseParams

    def _setup(self, seed: int) -> None:
        # The noise and its KL target adapt as the policy runs; params keeps the start.
        self.noise_std = float(self.params.noise_std)
        self.eps = float(self.params.eps)
        self.noise_generator = torch.Generator(device=self.device).manual_seed(seed + 11)

    def _noisy(self, contexts: Tensor, draws: int) -> Tensor:
        """Predictions under `draws` independent perturbations, one per context row."""
        params = {k: v.detach() for k, v in self.net.named_parameters()}
        noisy = {
            k: v
            + self.noise_std
            * torch.randn(
                (draws, *v.shape), generator=self.noise_generator, device=v.device, dtype=v.dtype
            )
            for k, v in params.items()
        }
        arms = torch.arange(self.n_arms, device=self.device)

        def one(p: dict[str, Tensor], x: Tensor) -> Tensor:
            pairs = x.expand(self.n_arms, *x.shape)  # (A, *context_shape)
            out: Tensor = functional_call(self.net, p, (pairs, arms, self.arm_features))
            return out  # (A,)

        if draws == 1:
            return vmap(one, in_dims=(None, 0))({k: v[0] for k, v in noisy.items()}, contexts)
        return vmap(one)(noisy, contexts)

    def draw(self, contexts: Tensor) -> Tensor:
        """One perturbed network per context: (B, D) -> (B, A)."""
        with torch.no_grad():
            return self._noisy(contexts, contexts.shape[0])

    def train(self) -> dict[str, float]:
        """Refit, then adapt the noise level."""
        metrics = super().train()
        data = self.buffer.view()
        rows = torch.randint(len(data), (self.params.d_samples,), generator=self.generator)
        x = data.x[rows.to(self.device)]
        with torch.no_grad():
            kl = _softmax_kl(self.predict(x), self._noisy(x, 1))
        delta = -math.log1p(-self.eps + self.eps / self.n_arms)
        self.noise_std = self.noise_std * 1.01 if kl < delta else self.noise_std / 1.01
        self.eps *= 0.99
        return metrics | {"noise_std": self.noise_std, "kl": kl}


def _softmax_kl(logits_p: Tensor, logits_q: Tensor) -> float:
    """Mean KL(softmax(p) || softmax(q)) over rows, clamped at 0 per row."""
    log_p = torch.log_softmax(logits_p.double(), dim=1)
    log_q = torch.log_softmax(logits_q.double(), dim=1)
    return float((log_p.exp() * (log_p - log_q)).sum(dim=1).clamp(min=0).mean())
