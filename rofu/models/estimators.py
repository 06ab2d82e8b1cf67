"""ROFU's estimators by name: what each prepares once per checkpoint and how it scores pairs.

`RofuConfig.estimator` names one of `ESTIMATORS` (`rofu.models.rofu_config`); this registry is
the one place that name is dispatched on. `exact` runs the M steps on the network
(`rofu.models.rofu_exact`, or torch.func in `rofu.models.rofu_functional`); `ntk` runs them on
its first-order expansion from a per-checkpoint `NtkBasis` (`rofu.models.rofu_ntk`);
`ntk-closed` and `ntk-kfac` solve that expansion's objective in closed form, from the
sample's Gram (`rofu.models.rofu_closed`) or Kronecker factors (`rofu.models.rofu_kfac`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.networks import RewardNet
from rofu.models.reward_model import RewardModel
from rofu.models.rofu_closed import ClosedBasis, closed_gains, prepare_closed
from rofu.models.rofu_config import ESTIMATORS, RofuConfig, minibatch_indices
from rofu.models.rofu_exact import ExactAscent
from rofu.models.rofu_functional import FunctionalAscent
from rofu.models.rofu_kfac import KfacFactors, kfac_gains, prepare_kfac
from rofu.models.rofu_ntk import Features, NtkBasis, features, ntk_gains, prepare_ntk

Params = dict[str, Tensor]
#: What an estimator prepares once per checkpoint.
Basis = NtkBasis | ClosedBasis | KfacFactors
Kernel = Literal["fast", "functional"]
BasisT = TypeVar("BasisT", NtkBasis, ClosedBasis, KfacFactors)
# Pairs per chunk when `config.chunk_size` is None. On a CPU the exact kernel slows by
# 1.5-3.5x once a chunk's activations outgrow the cache (measured for 64-100-100-10,
# 64-256-256-10 and 64-100-10 MLPs: `rofu bench kernel` times the old fixed 256 beside it).
CHUNK_BYTES = 8 << 20
MAX_CHUNK = 256


@dataclass(frozen=True)
class Pairs:
    """The P (context, arm) pairs of one call, on the network's device.

    Attributes:
        contexts: (B, *context_shape) the call's contexts.
        owner: (P,) the context of each pair.
        rows: (P,) each pair's row of `table` (its arm, for a per-arm network).
        table: (T, F) the arm feature rows the pairs read, or None.
        arms: (P,) each pair's arm.
        weights: (P,) the regulariser's w.
    """

    contexts: Tensor
    owner: Tensor
    rows: Tensor
    table: Tensor | None
    arms: Tensor
    weights: Tensor


#: Means and bonuses of the pairs, as parts to concatenate in pair order.
PairScores = tuple[list[Tensor], list[Tensor]]
#: How an estimator scores pairs: (net, theta, data, config, generator, pairs, basis, kernel).
PairsFn = Callable[
    [
        RewardModel,
        Params,
        RegulariserData,
        RofuConfig,
        torch.Generator,
        Pairs,
        Basis | None,
        Kernel,
    ],
    PairScores,
]


@dataclass(frozen=True)
class Estimator:
    """One estimator: its per-checkpoint preparation and its scoring of pairs.

    Attributes:
        name: the `RofuConfig.estimator` value.
        prepare: builds the checkpoint's `Basis` from (net, theta, data, config,
            generator, arm features), or None when the estimator keeps no basis.
        pairs: scores the pairs: (net, theta, data, config, generator, pairs, basis,
            kernel) -> (means, bonuses).
        graphs: whether `rofu.models.rofu_graphs` can capture it in CUDA graphs.
    """

    name: str
    prepare: Callable[
        [RewardModel, Params, RegulariserData, RofuConfig, torch.Generator, Tensor | None],
        Basis | None,
    ]
    pairs: PairsFn
    graphs: bool


def bonus(gain: Tensor, config: RofuConfig) -> Tensor:
    """bonus_scale * sqrt(max(gain, 0)), (P,)."""
    return config.bonus_scale * gain.clamp(min=0).sqrt()


def _no_basis(*_: object) -> None:
    return None


def _exact_pairs(
    net: RewardModel,
    theta: Params,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    pairs: Pairs,
    basis: Basis | None,
    kernel: Kernel,
) -> PairScores:
    device, dtype = pairs.contexts.device, pairs.contexts.dtype
    steps = minibatch_indices(len(data.sample), config, generator)
    sample = data.sample.to(device, dtype)  # no copy when already there
    ascent: ExactAscent | FunctionalAscent
    if kernel == "fast" and isinstance(net, RewardNet):  # the kernel's only model
        ascent = ExactAscent(net, sample, pairs.table, config, steps)
    else:
        ascent = FunctionalAscent(net, sample, pairs.table, config, steps)
    chunk = chunk_pairs(net, config, device, len(data.sample))
    mean, bonuses = [], []
    for start in range(0, pairs.arms.numel(), chunk):
        part = slice(start, start + chunk)
        pair_x = pairs.contexts[pairs.owner[part]]  # (P, *context_shape)
        f0, gain = ascent.ascend(theta, pair_x, pairs.rows[part], pairs.weights[part])
        mean.append(f0)
        bonuses.append(bonus(gain, config))
    return mean, bonuses


#: A linearised estimator's gains from its basis: (basis, query, pairs, config) -> (f0, gain).
Gains = Callable[[BasisT, Features, Pairs, RofuConfig], tuple[Tensor, Tensor]]
Prepare = Callable[
    [RewardModel, Params, RegulariserData, RofuConfig, torch.Generator, Tensor | None], BasisT
]


def _linearised(kind: type[BasisT], build: Prepare[BasisT], gains: Gains[BasisT]) -> PairsFn:
    """The scoring of an estimator on f's first-order expansion: the pairs' gradient features
    against the checkpoint's basis of type `kind` (built here when the call brings none)."""

    def pairs_scores(
        net: RewardModel,
        theta: Params,
        data: RegulariserData,
        config: RofuConfig,
        generator: torch.Generator,
        pairs: Pairs,
        basis: Basis | None,
        kernel: Kernel,
    ) -> PairScores:
        ready = (
            basis
            if isinstance(basis, kind)
            else build(net, theta, data, config, generator, pairs.table)
        )
        query = features(net, theta, pairs.contexts, pairs.rows, pairs.table, pairs.owner)
        f0, gain = gains(ready, query, pairs, config)
        return [f0], [bonus(gain, config)]

    return pairs_scores


def chunk_pairs(net: RewardModel, config: RofuConfig, device: torch.device, n_rows: int) -> int:
    """Pairs the exact estimator computes together: `config.chunk_size` when set; else, on a
    CPU and for an MLP `RewardNet`, as many as keep the working set, about
    (minibatch + 1) * sum(hidden) * 16 bytes a pair, within `CHUNK_BYTES` (at least one,
    at most `MAX_CHUNK`); else `MAX_CHUNK`. `n_rows` is the data sample's size (the
    minibatch when `minibatch_size` is None or larger)."""
    if config.chunk_size is not None:
        return config.chunk_size
    if device.type != "cpu" or not isinstance(net, RewardNet):
        return MAX_CHUNK
    rows = min(config.minibatch_size or n_rows, n_rows) + 1
    per_pair = rows * max(sum(net.config.hidden), 1) * 16
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // per_pair))


REGISTRY: dict[str, Estimator] = {
    "exact": Estimator("exact", _no_basis, _exact_pairs, graphs=True),
    "ntk": Estimator(
        "ntk",
        prepare_ntk,
        _linearised(NtkBasis, prepare_ntk, lambda b, q, p, c: ntk_gains(b, q, p.weights, c)),
        graphs=False,
    ),
    "ntk-closed": Estimator(
        "ntk-closed",
        prepare_closed,
        _linearised(
            ClosedBasis, prepare_closed, lambda b, q, p, c: closed_gains(b, q, p.weights, c)
        ),
        graphs=False,
    ),
    "ntk-kfac": Estimator(
        "ntk-kfac",
        prepare_kfac,
        _linearised(
            KfacFactors, prepare_kfac, lambda b, q, p, c: kfac_gains(b, q, p.arms, p.weights, c)
        ),
        graphs=False,
    ),
}
if tuple(REGISTRY) != ESTIMATORS:  # the names RofuConfig accepts are the ones dispatched
    raise RuntimeError(f"estimator registry {tuple(REGISTRY)} != RofuConfig's {ESTIMATORS}")


def get_estimator(name: str) -> Estimator:
    """The estimator called `name` (ValueError naming the known ones)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"estimator must be one of {', '.join(REGISTRY)}, got {name!r}") from None
