"""Closed-form NTK-ROFU with Kronecker-factored curvature (K-FAC; Martens and Grosse 2015).

The gain of the closed form (`rofu.models.rofu_closed`) is g_q^T Z^-1 g_q / (2 eta w) with
Z = lambda' I + J^T J / m, lambda' = l2 / w. For a `RewardNet` the gradient of layer l is
rank one, delta_l h_l^T (h_l the layer's input, with a 1 appended under a bias), so Z is
approximated block by block:

- a hidden layer: E[h h^T (x) delta delta^T] ~ A_l (x) S_l with A_l = E[h h^T] and
  S_l = E[delta delta^T] over the rows, damped as (A_l + pi gamma I) (x) (S_l + gamma / pi I),
  gamma = sqrt(lambda'), pi = sqrt((tr A_l / dim A_l) / (tr S_l / dim S_l)); the gain's term
  is then (h^T (A_l + pi gamma)^-1 h) (delta^T (S_l + gamma / pi)^-1 delta);
- the output layer exactly: with one output per arm its block for arm a is
  lambda' I + E[1{a_i = a} h h^T], with one output (arm features) lambda' I + E[h h^T].

The factors cost O(sum of squared widths) to store and per query, whatever the number of
rows they were estimated on, so they can summarise every row rather than a sample. One
eigendecomposition per factor serves every weight w.

Noise (`RofuConfig.noise`, `rofu.models.scaling`): with eta -> eta / (2 sigma^2) and
l2 -> 2 sigma^2 l2 the damping is lambda' = 2 sigma^2 l2 / w and the gain is multiplied by
2 sigma^2: g_q^T Z^-1 g_q sigma^2 / (eta w), Z built with that damping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rofu.models.data import RegulariserData, feature_rows
from rofu.models.networks import RewardNet
from rofu.models.rofu_closed import check_closed
from rofu.models.rofu_config import RofuConfig
from rofu.models.rofu_ntk import Features, Params, features


@dataclass(frozen=True)
class Eigen:
    """A symmetric factor as eigenvalues (..., n), clamped at 0, and eigenvectors (..., n, n)."""

    values: Tensor
    vectors: Tensor

    @classmethod
    def of(cls, matrix: Tensor) -> Eigen:
        values, vectors = torch.linalg.eigh(0.5 * (matrix + matrix.mT))
        return cls(values.clamp_min(0.0), vectors)

    def quadratic(self, v: Tensor, shift: Tensor) -> Tensor:
        """v^T (M + shift I)^-1 v for rows v (P, n) and shifts (P,) -> (P,)."""
        if self.vectors.ndim == 3:  # one factor per pair
            projected = (v[:, None, :] @ self.vectors)[:, 0]  # (P, n)
        else:
            projected = v @ self.vectors  # (P, n)
        return (projected.square() / (self.values + shift[:, None])).sum(dim=1)

    def mean_value(self) -> Tensor:
        """tr M / n (per group when batched)."""
        return self.values.mean(dim=-1)


@dataclass(frozen=True)
class KfacFactors:
    """Per hidden layer the eigendecomposed A_l and S_l, and the output layer's exact blocks.

    Attributes:
        inputs: per hidden layer, A_l over (I_l [+1]).
        outputs: per hidden layer, S_l over (O_l).
        last: the output layer's blocks: batched over arms (A, I [+1], I [+1]) with one
            output per arm, a single block otherwise.
        per_arm: whether `last` is batched over arms.
        bias: whether every layer input carries an appended 1.
    """

    inputs: tuple[Eigen, ...]
    outputs: tuple[Eigen, ...]
    last: Eigen
    per_arm: bool
    bias: bool


def _augmented(h: Tensor, bias: bool) -> Tensor:
    return torch.cat([h, h.new_ones(h.shape[0], 1)], dim=1) if bias else h


def prepare_kfac(
    net: nn.Module,
    theta: Params,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    arm_features: Tensor | None,
) -> KfacFactors:
    """The factors of one checkpoint in float64, estimated on the data sample's rows, at
    most `config.kfac_rows` of them (drawn from `generator` when the sample holds more).

    Raises:
        TypeError: `net` is not a `RewardNet`, whose layers the factors are of.
    """
    check_closed(config)
    if not isinstance(net, RewardNet):
        raise TypeError(
            f"estimator 'ntk-kfac' needs a RewardNet (an MLP), got {type(net).__name__}"
        )
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    sample = data.sample.to(device, dtype)
    if config.kfac_rows is not None and len(sample) > config.kfac_rows:
        drawn = torch.randperm(len(sample), generator=generator)[: config.kfac_rows]
        sample = sample.subset(drawn.to(device))
    index, table = feature_rows(sample.arms, sample.features, arm_features)
    rows = features(net, theta, sample.x, index, table)
    n = max(len(sample), 1)
    hs = [_augmented(h.detach().to(torch.float64), rows.bias) for h in rows.h]  # (N, I_l)
    deltas = [d.detach().to(torch.float64) for d in rows.delta]  # (N, O_l)
    inputs = tuple(Eigen.of(h.T @ h / n) for h in hs[:-1])
    outputs = tuple(Eigen.of(d.T @ d / n) for d in deltas[:-1])
    last_h = hs[-1]
    per_arm = net.config.per_arm_outputs
    if per_arm:
        last = Eigen.of(per_arm_blocks(last_h, sample.arms, net.config.n_arms) / n)
    else:
        last = Eigen.of(last_h.T @ last_h / n)
    return KfacFactors(inputs, outputs, last, per_arm, rows.bias)


def per_arm_blocks(h: Tensor, arms: Tensor, n_arms: int) -> Tensor:
    """(A, I, I) sum over each arm's rows of h h^T: one (n_a, I) product per arm, not the
    (N, A, I, I) einsum over a one-hot, which cost A times the work."""
    order = torch.argsort(arms)
    counts = torch.bincount(arms, minlength=n_arms).tolist()
    return torch.stack([rows.T @ rows for rows in torch.split(h[order], counts)])


def kfac_gains(
    factors: KfacFactors, query: Features, arms: Tensor, weight: Tensor, config: RofuConfig
) -> tuple[Tensor, Tensor]:
    """(f at theta, the gain g is applied to) for P query pairs, each (P,).

    Args:
        query: the pairs' rank-one features (`rofu.models.rofu_ntk.features`).
        arms: (P,) each pair's arm (the output unit under per-arm outputs).
        weight: (P,) w of each pair (|D| or n_a + 1).
    """
    f0 = query.value
    damping = config.l2 / weight.to(torch.float64)  # (P,) lambda'
    gamma = damping.sqrt()
    total = torch.zeros_like(damping)
    for layer, (a_factor, s_factor) in enumerate(zip(factors.inputs, factors.outputs, strict=True)):
        h = _query_inputs(query, layer, factors.bias)  # (P, I_l)
        delta = query.delta[layer].detach().to(torch.float64)  # (P, O_l)
        ratio = a_factor.mean_value() / s_factor.mean_value().clamp_min(1e-300)
        pi = float(math.sqrt(ratio)) if float(ratio) > 0 else 1.0
        total += a_factor.quadratic(h, pi * gamma) * s_factor.quadratic(delta, gamma / pi)
    h_last = _query_inputs(query, len(factors.inputs), factors.bias)
    if factors.per_arm:
        picked = Eigen(factors.last.values[arms], factors.last.vectors[arms])
        total += picked.quadratic(h_last, damping)
    else:
        total += factors.last.quadratic(h_last, damping)
    gain = total / (2.0 * config.eta * weight.to(torch.float64))
    return f0, gain.to(f0.dtype)


def _query_inputs(query: Features, layer: int, bias: bool) -> Tensor:
    """(P, I_l [+1]) the pairs' inputs of `layer`, one row per pair."""
    h = query.h[layer].detach().to(torch.float64)
    if query.owner is not None:
        h = h[query.owner]
    return _augmented(h, bias)
