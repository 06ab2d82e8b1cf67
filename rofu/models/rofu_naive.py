"""The naive ROFU loop: copy the network per (context, arm) pair and run an optimiser.

This is the definition the batched `rofu_scores` must equal to float tolerance, and the
baseline the kernel benchmark times it against. It consumes the generator exactly as
`rofu_scores` does, so both see the same regulariser minibatches, and runs each copy in
eval mode (batch norm on its running statistics), as `rofu_scores` runs the network.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.reward_model import RewardModel
from rofu.models.rofu_config import RofuConfig, minibatch_indices, regulariser_weights
from rofu.models.scores import Scores


def rofu_scores_naive(
    net: RewardModel,
    contexts: Tensor,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    *,
    candidates: Tensor | None = None,
    arm_features: Tensor | None = None,
) -> Scores:
    """Per-pair loop equivalent of `rofu.models.rofu.rofu_scores` (same arguments and result)."""
    n_arms = net.arm_count(arm_features)
    mask = candidates if candidates is not None else torch.ones(len(contexts), n_arms).bool()
    steps = minibatch_indices(len(data.sample), config, generator)
    all_arms = torch.arange(n_arms)
    weights = regulariser_weights(data, all_arms, config)  # (A,)
    mean = torch.full(mask.shape, float("nan"), dtype=contexts.dtype)
    bonus = mean.clone()
    for b in range(len(contexts)):
        for a in mask[b].nonzero().flatten().tolist():
            args = (net, contexts[b], a, data, config, steps, arm_features, float(weights[a]))
            f0, f_m = _ascend_one(*args, push=True)
            base = f0 if config.baseline == "start" else _ascend_one(*args, push=False)[1]
            mean[b, a] = f0
            bonus[b, a] = config.bonus_scale * max(f_m - base, 0.0) ** 0.5
    return Scores(mean=mean, bonus=bonus)


def _ascend_one(
    net: RewardModel,
    x: Tensor,
    arm: int,
    data: RegulariserData,
    config: RofuConfig,
    steps: Tensor | None,
    arm_features: Tensor | None,
    weight: float,
    *,
    push: bool,
) -> tuple[float, float]:
    """f at theta and after M optimiser steps (without the optimism term unless `push`)."""
    model = copy.deepcopy(net).eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.step_size)
    x_one, arm_one = x[None], torch.tensor([arm], device=x.device)
    with torch.no_grad():
        f0 = float(model(x_one, arm_one, arm_features)[0])
    sample = data.sample
    for step in range(config.steps):
        rows = slice(None) if steps is None else steps[step]
        pred = model(sample.x[rows], sample.arms[rows], arm_features)
        loss = (pred - sample.rewards[rows]).square().mean()
        if push:
            loss = loss - model(x_one, arm_one, arm_features)[0] / (config.eta * weight)
        if config.l2 > 0:
            loss = loss + config.l2 / weight * sum(p.square().sum() for p in model.parameters())
        for group in optimizer.param_groups:
            group["lr"] = config.step_size * config.step_decay**step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        f_m = float(model(x_one, arm_one, arm_features)[0])
    return f0, f_m
