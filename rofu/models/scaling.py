"""The reward's own scale: the prequential noise variance and the learner's standardisation.

ROFU's regulariser read as a Gaussian log-likelihood with a prior on theta is

    R(theta) = sum_i (f_theta(x_i, a_i) - r_i)^2 / (2 sigma^2) + l2 |theta|^2,

so in the estimators' form (`rofu.models.rofu`: w * MSE + l2 |theta|^2, weighted by eta)
the data term is divided by 2 sigma^2 while the prior stays:

    eta -> eta / (2 sigma^2),      l2 -> 2 sigma^2 l2.

The closed form's gain g^T Z^-1 g / (2 eta w), Z = (l2 / w) I + J^T J / m, then becomes
2 sigma^2 g^T (2 sigma^2 l2 / w + J^T J / m)^-1 g / (2 eta w): LinUCB's posterior variance
sigma^2 x^T (X^T X + sigma^2 l2 I)^-1 x up to the regulariser's weights, so the bonus grows
with sigma as LinUCB's beta does. `noise="fixed"` is sigma^2 = 1/2, where both maps are
the identity (today's R = w MSE). `noise="prequential"` takes sigma^2 from the data: an
exponentially weighted mean of (r_t - f_{theta_{t-1}}(x_t, a_t))^2 over new rows, each
scored by the model before the refit that trains on it (`Prequential`).

A standardising `RewardNet` (`RewardNetConfig.standardise`) computes
f(x) = mu_r + s_r g((x - mu_x) / s_x) with running statistics; the estimators run on g
itself (a plain `RewardNet` with the same parameters) and on standardised data. With
f = mu_r + s_r g the objective f - eta R is s_r (g - eta' R') with R' in g's units and

    eta' = eta s_r / (2 sigma^2),      l2' = 2 sigma^2 l2 / s_r^2,

so the mean maps back as mu_r + s_r mean_g and the gain as s_r gain_g: the bonus,
bonus_scale sqrt(gain), as sqrt(s_r) bonus_g. Scaling every reward by c scales s_r and
sigma by c and leaves g, its data and l2' unchanged, so every closed-form bonus scales by
exactly c (`Standardiser`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.data import Prequential, RegulariserData, Transitions
from rofu.models.networks import RewardNet
from rofu.models.reward_model import RewardModel
from rofu.models.rofu_config import RofuConfig
from rofu.models.scores import Scores

#: sigma^2 under `noise="fixed"` (and before any row has been scored): R = w MSE.
FIXED_NOISE_VARIANCE = 0.5
#: The smallest sigma^2 a bonus is computed with (a model that fits every row exactly).
NOISE_FLOOR = 1e-12


def noise_variance(config: RofuConfig, noise: Prequential | None) -> float:
    """sigma^2 the regulariser is divided by: 1/2 under `fixed` or before any row was
    scored, else the prequential estimate (at least `NOISE_FLOOR`)."""
    if config.noise == "fixed" or noise is None or noise.variance is None:
        return FIXED_NOISE_VARIANCE
    return max(noise.variance, NOISE_FLOOR)


def resolve_noise(
    config: RofuConfig, noise: Prequential | None, r_scale: float = 1.0
) -> RofuConfig:
    """The configuration the estimators score with: eta and l2 carrying sigma^2 and the
    reward scale s_r (module docstring), `noise` resolved to `fixed` so that resolving
    again is a no-op. `config` itself when both maps are the identity."""
    variance = noise_variance(config, noise)
    if variance == FIXED_NOISE_VARIANCE and r_scale == 1.0:
        return dataclasses.replace(config, noise="fixed") if config.noise != "fixed" else config
    return dataclasses.replace(
        config,
        noise="fixed",
        eta=config.eta * r_scale / (2.0 * variance),
        l2=config.l2 * 2.0 * variance / r_scale**2,
    )


def squared_residuals(net: RewardModel, batch: Transitions, arm_features: Tensor | None) -> Tensor:
    """(N,) (r - f(x, a))^2 of the network as it is now, on the reward's scale; none (0,)
    from a standardising network that has observed fewer than two rows, whose scale is
    not yet the reward's (so sigma^2 scales with the rewards from the first row it has)."""
    first = next(net.parameters())
    if isinstance(net, RewardNet) and net.config.standardise and float(net.stat_count) < 2:
        return torch.zeros(0, dtype=first.dtype, device=first.device)
    batch = batch.to(first.device, first.dtype)
    table = arm_features
    arms = batch.arms
    if batch.features is not None:  # rows that carry their own arm features
        table, arms = batch.features, torch.arange(len(batch), device=first.device)
    with torch.no_grad():
        predicted: Tensor = net(batch.x, arms, table)
        return (predicted - batch.rewards).square()


@dataclass(frozen=True)
class Standardiser:
    """The affine maps of a standardising network, frozen at one checkpoint.

    Attributes:
        x_shift, x_scale: (D,) mu_x and s_x.
        r_shift, r_scale: mu_r and s_r.
    """

    x_shift: Tensor
    x_scale: Tensor
    r_shift: float
    r_scale: float

    @classmethod
    def of(cls, net: RewardNet) -> Standardiser:
        """The network's current statistics."""
        (x_shift, x_scale), (r_shift, r_scale) = net.context_moments(), net.reward_moments()
        return cls(x_shift.detach(), x_scale.detach(), float(r_shift), float(r_scale))

    def contexts(self, x: Tensor) -> Tensor:
        """(B, D) contexts in g's units."""
        return (x - self.x_shift.to(x)) / self.x_scale.to(x)

    def data(self, data: RegulariserData) -> RegulariserData:
        """The regulariser's data in g's units (the counts and noise unchanged)."""
        sample = data.sample
        rewards = (sample.rewards - self.r_shift) / self.r_scale
        standard = Transitions(self.contexts(sample.x), sample.arms, rewards, sample.features)
        return data.with_sample(standard)

    def scores(self, scores: Scores) -> Scores:
        """g's scores on the reward's scale: mean mu_r + s_r mean, bonus sqrt(s_r) bonus."""
        return Scores(self.r_shift + self.r_scale * scores.mean, self.r_scale**0.5 * scores.bonus)


def plain_network(net: RewardNet) -> RewardNet:
    """g: a plain `RewardNet` holding `net`'s parameters (shared, not copied)."""
    plain = RewardNet(dataclasses.replace(net.config, standardise=False))
    plain.layers = net.layers
    return plain.train(net.training)


def scoring_inputs(
    net: RewardModel, data: RegulariserData, config: RofuConfig
) -> tuple[RewardModel, RegulariserData, RofuConfig, Standardiser | None]:
    """What the estimators see of a checkpoint: the network (g for a standardising one),
    its data in that network's units, the configuration with sigma^2 and s_r resolved,
    and the standardiser that maps g's scores back (None: none to map)."""
    if not (isinstance(net, RewardNet) and net.config.standardise):
        return net, data, resolve_noise(config, data.noise), None
    standard = Standardiser.of(net)
    config = resolve_noise(config, data.noise, standard.r_scale)
    return plain_network(net), standard.data(data), config, standard
