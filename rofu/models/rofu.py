"""ROFU (Zhou et al. 2021, Alg. 2): an upper confidence bound by M steps of gradient ascent.

For every (context x, arm a) pair, start at the served parameters theta and ascend

    f_theta(x, a) - eta * R(theta),   R(theta) = w * MSE(theta; minibatch of D) + l2 * |theta|^2

where w = |D| (form `dataset`, the paper's R = |D| MSE) or w = n_a + 1 (form `arm_count`,
the authors' experiment code). Then

    ucb(x, a) = f_theta(x, a) + bonus_scale * sqrt(max(f_theta_M(x, a) - f_theta(x, a), 0)).

Step size is in the authors' normalised units: each step descends
MSE + (l2 / w) |theta|^2 - f / (eta * w) with step kappa_j = step_size * step_decay^j, which
is exactly ascent on f - eta * R with step kappa_j / (eta * w), but keeps kappa meaningful
whatever |D| is.

The network is any `RewardModel` (`rofu.models.reward_model`): the MLP `RewardNet`, a
`ConvRewardNet`, or a plain module wrapped as one; contexts are (B, *context_shape).

Estimators (`RofuConfig.estimator`): `exact` runs the steps on the network. With
`kernel="fast"` a `RewardNet` takes the hand-written batched kernel of `rofu.models.rofu_exact`
and every other model falls back to the torch.func path of `rofu.models.rofu_functional`
(`kernel="functional"` forces it: the reference the kernel is measured against). `ntk`
runs them on the network's first-order expansion (`rofu.models.rofu_ntk`: rank-one kernels for
a `RewardNet`, explicit per-row gradients otherwise), from an `NtkBasis` that can be
prepared once per checkpoint. Both run the network in eval mode (batch norm on its running
statistics) and restore the caller's mode afterwards.

With `RofuConfig(noise="prequential")` R's data term is divided by 2 sigma^2, sigma^2 from
`data.noise`: every estimator then runs with eta / (2 sigma^2) and 2 sigma^2 l2 in place of
eta and l2 (`rofu.models.scaling.resolve_noise`, applied here and in
`rofu.models.prepared.prepare`). A standardising `RewardNet` is scored through `prepare`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.estimators import (
    CHUNK_BYTES,
    MAX_CHUNK,
    Basis,
    Pairs,
    chunk_pairs,
    get_estimator,
)
from rofu.models.networks import RewardNet
from rofu.models.reward_model import RewardModel, evaluating
from rofu.models.rofu_config import (
    BASELINES,
    CLOSED_FORMS,
    ESTIMATORS,
    REGULARISERS,
    RofuConfig,
    minibatch_indices,
    regulariser_weights,
)
from rofu.models.rofu_ntk import NtkBasis, prepare_ntk
from rofu.models.rofu_stability import ascent_stiffness, resolve_step
from rofu.models.scaling import resolve_noise
from rofu.models.scores import Scores
from rofu.models.validation import (
    check_choice,
    check_context_batch,
    check_float_tensor,
    check_mask_tensor,
    describe_contexts,
    require_tensor,
)

__all__ = [
    "BASELINES",
    "ESTIMATORS",
    "REGULARISERS",
    "CHUNK_BYTES",
    "MAX_CHUNK",
    "NtkBasis",
    "RofuConfig",
    "chunk_pairs",
    "minibatch_indices",
    "ntk_basis",
    "regulariser_weights",
    "rofu_scores",
]

Params = dict[str, Tensor]
KERNELS = ("fast", "functional")


def rofu_scores(
    net: RewardModel,
    contexts: Tensor,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    *,
    candidates: Tensor | None = None,
    arm_features: Tensor | None = None,
    pair_features: Tensor | None = None,
    params: Params | None = None,
    basis: Basis | None = None,
    kernel: Literal["fast", "functional"] = "fast",
) -> Scores:
    """Score B contexts x A arms with ROFU, all pairs batched.

    Args:
        net: any `RewardModel`; gives the network's structure and buffers (and its
            parameters unless `params` is given).
        contexts: (B, *context_shape) contexts: (B, D) for an MLP, (B, C, H, W) images.
        data: the regulariser's data sample with |D| and per-arm counts.
        config: ROFU hyper-parameters (`config.estimator` picks exact or ntk). With a
            `stability_cap`, the step is resolved here (`rofu.models.rofu_stability`); pass
            `checkpoint_config`'s result to resolve it once per checkpoint.
        generator: draws the regulariser minibatches (CPU generator); not used by `ntk`
            when `basis` is given.
        candidates: (B, A) bool, pairs to score; None scores every arm.
        arm_features: (A, F) arm features, required by arm-feature networks. Rows of the
            data sample that carry their own (`Transitions.features`) read those.
        pair_features: (B, A, F) per-request arm features of an arm-feature network:
            context b scores arm a with `pair_features[b, a]` instead of `arm_features[a]`
            (the regulariser's rows and weights are unchanged; arm a's pull count stays
            arm a's). Only the candidates' entries are read.
        params: parameters theta_{t-1}; defaults to `net`'s own.
        basis: for `ntk`, the checkpoint's prepared `ntk_basis` (built here when None).
        kernel: for `exact`, `fast` takes the hand-written kernel where it applies (a
            `RewardNet`) and torch.func elsewhere; `functional` always torch.func (the
            reference).

    Returns:
        Scores with (B, A) mean and bonus; NaN where `candidates` is False.

    Raises:
        ValueError, TypeError: on a bad argument, naming it.
        RuntimeError: under torch.inference_mode(), where no gradient can be taken.
    """
    if torch.is_inference_mode_enabled():
        raise RuntimeError("rofu_scores needs gradients; do not call it under inference_mode")
    check_choice("kernel", kernel, KERNELS)
    config = resolve_noise(config, data.noise if isinstance(data, RegulariserData) else None)
    theta = _parameters(net, params)
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    contexts, arm_features, mask = _validated(net, contexts, data, candidates, arm_features)
    _check_pair_features(net, pair_features, mask.shape)
    if arm_features is not None:
        arm_features = arm_features.to(device, dtype)
    # Callers that score a checkpoint often resolve the step once (`rofu.models.prepared`).
    if config.stability_cap is not None and config.estimator not in CLOSED_FORMS:
        config = resolve_step(net, data, config, theta, arm_features)
    batch_idx, arms = mask.nonzero(as_tuple=True)  # (P,), (P,)
    weights = regulariser_weights(data, arms, config).to(device, dtype)  # (P,)
    table, rows = _query_rows(net, arm_features, pair_features, batch_idx, arms)
    pairs = Pairs(
        contexts.to(device, dtype), batch_idx.to(device), rows.to(device), table, arms, weights
    )
    estimator = get_estimator(config.estimator)
    with evaluating(net):  # batch norm on its running statistics; the caller's mode after
        mean, bonus = estimator.pairs(net, theta, data, config, generator, pairs, basis, kernel)
    return _scatter(mask, batch_idx, arms, mean, bonus, device, dtype)


def _query_rows(
    net: RewardModel,
    arm_features: Tensor | None,
    pair_features: Tensor | None,
    batch_idx: Tensor,
    arms: Tensor,
) -> tuple[Tensor | None, Tensor]:
    """The feature table the P pairs read and each pair's row of it, (P,).

    Without per-request features: `arm_features`, read at each pair's arm. With them:
    `arm_features` followed by the B x A per-request rows; pair (b, a) reads row
    A + b * A + a.
    """
    if pair_features is None or arm_features is None:
        return arm_features, arms
    n_arms = arm_features.shape[0]
    flat = pair_features.to(arm_features).reshape(-1, net.arm_feature_dim)  # (B*A, F)
    return torch.cat([arm_features, flat]), n_arms + batch_idx * n_arms + arms


def ntk_basis(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    *,
    arm_features: Tensor | None = None,
    params: Params | None = None,
) -> NtkBasis:
    """Prepare NTK-ROFU's per-checkpoint work once (see `rofu.models.rofu_ntk`).

    The basis is valid for these parameters, this data sample and these arm features;
    |D| and the arm counts may change afterwards (they enter only the per-pair weights).
    """
    theta, arm_features = checkpoint_inputs(net, data, arm_features, params)
    config = resolve_noise(config, data.noise)
    with torch.no_grad(), evaluating(net):
        return prepare_ntk(net, theta, data, config, generator, arm_features)


def checkpoint_config(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    *,
    arm_features: Tensor | None = None,
    params: Params | None = None,
) -> RofuConfig:
    """The configuration a checkpoint is scored with: `config` itself, or with a
    `stability_cap` the step it resolves to at these parameters and data
    (`rofu.models.rofu_stability`). Resolve once per checkpoint and score with the result."""
    if config.stability_cap is None:
        return config
    theta, arm_features = checkpoint_inputs(net, data, arm_features, params)
    config = resolve_noise(config, data.noise)
    return resolve_step(net, data, config, theta, arm_features)


def ascent_rho(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    *,
    arm_features: Tensor | None = None,
    params: Params | None = None,
) -> float:
    """rho at `config`'s own step (no cap applied): the step times the regulariser's
    largest curvature at these parameters and data (`rofu.models.rofu_stability`). The ascent
    is monotone up to 1 and diverges past 2."""
    theta, arm_features = checkpoint_inputs(net, data, arm_features, params)
    config = resolve_noise(config, data.noise)
    return ascent_stiffness(net, data, config, theta, arm_features)


def checkpoint_inputs(
    net: RewardModel,
    data: RegulariserData,
    arm_features: Tensor | None,
    params: Params | None,
) -> tuple[Params, Tensor | None]:
    """The parameters and checked arm features (on the parameters' device) of a checkpoint."""
    theta = _parameters(net, params)
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    dummy = torch.zeros(0, *net.context_shape, dtype=dtype)
    _, arm_features, _ = _validated(net, dummy, data, None, arm_features)
    if arm_features is not None:
        arm_features = arm_features.to(device, dtype)
    return theta, arm_features


def _parameters(net: RewardModel, params: Params | None) -> Params:
    if not isinstance(net, RewardModel):
        raise TypeError(
            f"net must be a RewardModel (rofu.models.reward_model), got {type(net).__name__}"
        )
    if isinstance(net, RewardNet) and net.config.standardise:
        raise ValueError(
            "net standardises its inputs and rewards: score it through "
            "rofu.models.prepared.prepare and score, which map g's scores back"
        )
    source = params if params is not None else dict(net.named_parameters())
    expected = {name for name, _ in net.named_parameters()}
    if set(source) != expected:
        raise ValueError(f"params must have exactly the keys {sorted(expected)}")
    return {name: p.detach() for name, p in source.items()}


def _validated(
    net: RewardModel,
    contexts: Tensor,
    data: RegulariserData,
    candidates: Tensor | None,
    arm_features: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    contexts = check_context_batch("contexts", contexts, net.context_shape)
    if net.per_arm_outputs:
        if arm_features is not None:
            raise ValueError("arm_features must be None for a network with one output per arm")
    else:
        arm_features = check_float_tensor(
            "arm_features", arm_features, ndim=2, size={1: net.arm_feature_dim}
        )
    n_arms = net.arm_count(arm_features)
    if not isinstance(data, RegulariserData):
        raise TypeError(f"data must be RegulariserData, got {type(data).__name__}")
    if len(data.sample) == 0:
        raise ValueError("data.sample is empty: ROFU needs at least one logged transition")
    if tuple(data.sample.x.shape[1:]) != net.context_shape:
        raise ValueError(f"data.sample.x must have {describe_contexts(net.context_shape)}")
    own = data.sample.features
    if own is not None and (net.per_arm_outputs or own.shape[1] != net.arm_feature_dim):
        raise ValueError(
            f"data.sample.features must have {net.arm_feature_dim} columns (per-row arm "
            "features need an arm-feature network)"
        )
    if own is None and int(data.sample.arms.max()) >= n_arms:
        raise ValueError(f"data.sample.arms refers to an arm >= {n_arms}, the number of arms")
    shape = (contexts.shape[0], n_arms)
    if candidates is None:
        return contexts, arm_features, torch.ones(shape, dtype=torch.bool)
    mask = require_tensor("candidates", candidates).cpu()
    return contexts, arm_features, check_mask_tensor("candidates", mask, shape)


def _check_pair_features(
    net: RewardModel, pair_features: Tensor | None, shape: tuple[int, ...]
) -> None:
    if pair_features is None:
        return
    if net.per_arm_outputs:
        raise ValueError("pair_features must be None for a network with one output per arm")
    check_float_tensor(
        "pair_features",
        pair_features,
        ndim=3,
        size={0: shape[0], 1: shape[1], 2: net.arm_feature_dim},
    )


def _scatter(
    mask: Tensor,
    batch_idx: Tensor,
    arms: Tensor,
    mean: list[Tensor],
    bonus: list[Tensor],
    device: torch.device,
    dtype: torch.dtype,
) -> Scores:
    def fill(parts: list[Tensor]) -> Tensor:
        out = torch.full(mask.shape, float("nan"), dtype=dtype, device=device)
        if parts:
            out[batch_idx.to(device), arms.to(device)] = torch.cat(parts).detach()
        return out

    return Scores(mean=fill(mean), bonus=fill(bonus))
