"""How stable ROFU's ascent is at a checkpoint, and the step that keeps it stable.

Each of the M steps descends the minibatch MSE with step kappa (`rofu.models.rofu`). Near theta
the MSE's curvature is the Gauss-Newton matrix (2/m) J^T J of the minibatch's gradient
rows J, whose largest eigenvalue is L = 2 lambda_max(K) / m, K = J J^T the rows' kernel
(plus 2 l2 for the l2 term, w >= 1). Gradient descent on it is monotone while

    rho = kappa * L <= 1,

oscillates for 1 < rho < 2 and diverges beyond 2. Past 2 the M steps amplify the bonus on
the network's first-order expansion (`ntk`) by up to (rho - 1)^(M - 1), and on the
network itself (`exact`) leave it wherever the overshoot lands. rho grows with the
network's gradients, so with the size of its weights and of the rewards: on Mushroom
(rewards +5 or -35) it passed 2 within 300 rounds and kept growing with the weights; on
Statlog it sits near 0.3 but passes 2 at times, when a minibatch holds rare rows whose
gradients are large (`rofu bench stability`, README "Ascent stability").

`RofuConfig.stability_cap` (None: off, the paper's fixed step) caps the step at
`cap / L` for each checkpoint. L is estimated once per checkpoint, from M minibatches
drawn with a fixed seed, so that every replica, `rofu evaluate` and the replay resolve the
same step for the same theta and data. Where the trace bound rho <= kappa 2 mean |g|^2
already keeps within the cap, the kernels are not built.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.reward_model import RewardModel, evaluating
from rofu.models.rofu_config import RofuConfig
from rofu.models.rofu_ntk import Params, step_rows

#: Seeds the minibatches the curvature is estimated on (not the ascent's own).
CURVATURE_SEED = 20_211_209
#: Power iteration on K stops when its estimate moves by less than this fraction, or after
#: POWER_STEPS steps. K is dominated by the rows' common gradient direction, so it
#: converges in a few steps; every estimate is a lower bound on lambda_max.
POWER_TOLERANCE = 1e-5
POWER_STEPS = 64


def ascent_stiffness(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    theta: Params,
    arm_features: Tensor | None = None,
    *,
    within: float | None = None,
) -> float:
    """rho = kappa * L at `theta`: the largest over M minibatches (one draw with
    `CURVATURE_SEED`), with kappa the first step's `config.step_size`. 0 with no data.

    With `within`, the trace bound kappa (2 max_j mean_i |g_i|^2 + 2 l2) >= rho is
    returned instead when it is no more than `within`: enough to know the cap is not
    reached, without the kernels.
    """
    if len(data.sample) == 0 or config.steps == 0:
        return 0.0
    generator = torch.Generator().manual_seed(CURVATURE_SEED)
    with torch.no_grad(), evaluating(net):
        rows, _, offsets = step_rows(net, theta, data, config, generator, arm_features)
        spans = list(zip(offsets, offsets[1:], strict=False))
        if within is not None:
            norms = rows.square_norm()
            trace = max(float(norms[lo:hi].mean()) for lo, hi in spans)
            bound = config.step_size * (2.0 * trace + 2.0 * config.l2)
            if bound <= within:
                return bound
        blocks = [rows.slice(lo, hi).kernel(rows.slice(lo, hi)).double() for lo, hi in spans]
    size = offsets[1] - offsets[0]
    curvature = 2.0 * largest_eigenvalue(torch.stack(blocks)) / size + 2.0 * config.l2
    return config.step_size * curvature


def largest_eigenvalue(kernels: Tensor) -> float:
    """The largest lambda_max over (E, m, m) positive semi-definite matrices, by power
    iteration from the all-ones direction: |K v| for the last unit v, which never
    decreases from step to step and never exceeds lambda_max."""
    vector = torch.ones(*kernels.shape[:2], 1, dtype=kernels.dtype, device=kernels.device)
    vector = vector / kernels.shape[1] ** 0.5
    estimate = 0.0
    for _ in range(POWER_STEPS):
        image = kernels @ vector  # (E, m, 1)
        norm = image.norm(dim=1, keepdim=True)  # (E, 1, 1)
        previous, estimate = estimate, float(norm.max())
        if estimate == 0.0 or estimate - previous <= POWER_TOLERANCE * estimate:
            break
        vector = torch.where(norm > 0, image / norm.clamp(min=1e-300), vector)
    return estimate


def resolve_step(
    net: RewardModel,
    data: RegulariserData,
    config: RofuConfig,
    theta: Params,
    arm_features: Tensor | None = None,
) -> RofuConfig:
    """`config` with the step this checkpoint runs and no cap left to apply: the step
    unchanged when `stability_cap` is None or rho is within it, else scaled to rho = cap.

    The result is what the estimators read; resolving it again changes nothing.
    """
    if config.stability_cap is None:
        return config
    rho = ascent_stiffness(net, data, config, theta, arm_features, within=config.stability_cap)
    return dataclasses.replace(config, step_size=capped_step(config, rho), stability_cap=None)


def capped_step(config: RofuConfig, rho: float) -> float:
    """The step `config` runs at a checkpoint whose rho (at `config.step_size`) is `rho`:
    scaled to rho = cap where rho exceeds the cap, else unchanged."""
    cap = config.stability_cap
    if cap is None or not rho > cap:
        return config.step_size
    return config.step_size * cap / rho
