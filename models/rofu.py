"""ROFU (Zhou et al. 2021, Alg. 2): an upper confidence bound by M steps of gradient ascent.

For every (context x, arm a) pair, start at the served parameters theta and ascend

    f_theta(x, a) - eta * R(theta),   R(theta) = w * MSE(theta; minibatch of D) + l2 * |theta|^2

where w = |D| (form `dataset`, the paper's R = |D| MSE) or w = n_a + 1 (form `arm_count`,
the authors' experiment code). Then

    ucb(x, a) = f_theta(x, a) + bonus_scale * sqrt(max(f_theta_M(x, a) - f_theta(x, a), 0)).

Step size is in the authors' normalised units: each step descends
MSE + (l2 / w) |theta|^2 - f / (eta * w) with step kappa_j = step_size * step_decay^j, which
is exactly ascent on f - eta * R with step kappa_j / (eta * w), but keeps kappa meaningful
whatever |D| is. All pairs run together with torch.func (functional_call + grad + vmap);
the first step, where every pair still sits at theta, shares one regulariser gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from models.data import RegulariserData, Transitions
from models.networks import RewardNet
from models.scores import Scores
from models.validation import (
    check_choice,
    check_float,
    check_float_tensor,
    check_int,
    check_mask_tensor,
    require_tensor,
)

Params = dict[str, Tensor]
REGULARISERS = ("dataset", "arm_count")
BASELINES = ("start", "drift")


@dataclass(frozen=True)
class RofuConfig:
    """Hyper-parameters of the ROFU estimator.

    Defaults follow the paper's experiments (M = 5, eta = 1, R = |D| MSE, g = sqrt) with
    the authors' code's SGD step 0.01 and a regulariser minibatch of 256.

    Attributes:
        steps: M, gradient-ascent steps (0 gives a zero bonus).
        step_size: kappa, in normalised units (see the module docstring).
        step_decay: kappa_j = step_size * step_decay ** j.
        eta: weight of the regulariser.
        regulariser: `dataset` (w = |D|) or `arm_count` (w = n_a + 1).
        l2: coefficient of |theta|^2 inside R (1 with eta = 1/2 gives LinUCB, paper Thm 1).
        minibatch_size: rows of the data sample per step; None uses the whole sample.
        bonus_scale: multiplies g(w) = sqrt(max(w, 0)) (the authors' `coef`).
        chunk_size: pairs computed together; bounds memory at roughly
            chunk_size * minibatch_size * sum(hidden) * 16 bytes.
        baseline: what the gain g is applied to is measured against. `start` (the paper):
            f_theta_M(x, a) - f_theta(x, a). `drift`: f_theta_M(x, a) - f_theta~_M(x, a),
            where theta~ takes the same steps on the same minibatches without the
            optimism term; this removes the change in f that R's own descent causes when
            theta_{t-1} does not minimise R exactly (and equals `start` when it does).
    """

    steps: int = 5
    step_size: float = 0.01
    step_decay: float = 1.0
    eta: float = 1.0
    regulariser: str = "dataset"
    l2: float = 0.0
    minibatch_size: int | None = 256
    bonus_scale: float = 1.0
    chunk_size: int = 256
    baseline: str = "start"

    def __post_init__(self) -> None:
        check_int("steps", self.steps, low=0)
        check_float("step_size", self.step_size, low=0.0, low_open=True)
        check_float("step_decay", self.step_decay, low=0.0, high=1.0, low_open=True)
        check_float("eta", self.eta, low=0.0, low_open=True)
        check_choice("regulariser", self.regulariser, REGULARISERS)
        check_float("l2", self.l2, low=0.0)
        if self.minibatch_size is not None:
            check_int("minibatch_size", self.minibatch_size, low=1)
        check_float("bonus_scale", self.bonus_scale, low=0.0)
        check_int("chunk_size", self.chunk_size, low=1)
        check_choice("baseline", self.baseline, BASELINES)


def minibatch_indices(n_rows: int, config: RofuConfig, generator: torch.Generator) -> Tensor | None:
    """Rows of the data sample used at each step: (M, m), or None for the whole sample.

    Every pair of one call sees the same minibatches (common random numbers).
    """
    if config.minibatch_size is None or config.minibatch_size >= n_rows:
        return None
    return torch.randint(n_rows, (config.steps, config.minibatch_size), generator=generator)


def regulariser_weights(data: RegulariserData, arms: Tensor, config: RofuConfig) -> Tensor:
    """w per pair: |D| for `dataset`, n_a + 1 for `arm_count`. (P,) int64 -> (P,) float64."""
    if config.regulariser == "dataset":
        return torch.full(arms.shape, float(data.n_total), dtype=torch.float64)
    counts = data.arm_counts.to(torch.float64)
    needed = int(arms.max()) + 1 if arms.numel() else 0
    if counts.numel() < needed:  # arms added after the data was counted have no pulls
        counts = torch.cat([counts, counts.new_zeros(needed - counts.numel())])
    return counts[arms.cpu()] + 1.0


def rofu_scores(
    net: RewardNet,
    contexts: Tensor,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    *,
    candidates: Tensor | None = None,
    arm_features: Tensor | None = None,
    params: Params | None = None,
) -> Scores:
    """Score B contexts x A arms with ROFU, all pairs batched.

    Args:
        net: gives the network's structure (and its parameters unless `params` is given).
        contexts: (B, D) contexts.
        data: the regulariser's data sample with |D| and per-arm counts.
        config: ROFU hyper-parameters.
        generator: draws the regulariser minibatches (CPU generator).
        candidates: (B, A) bool, pairs to score; None scores every arm.
        arm_features: (A, F) arm features, required by arm-feature networks.
        params: parameters theta_{t-1}; defaults to `net`'s own.

    Returns:
        Scores with (B, A) mean and bonus; NaN where `candidates` is False.

    Raises:
        ValueError, TypeError: on a bad argument, naming it.
        RuntimeError: under torch.inference_mode(), where no gradient can be taken.
    """
    if torch.is_inference_mode_enabled():
        raise RuntimeError("rofu_scores needs gradients; do not call it under inference_mode")
    theta = _parameters(net, params)
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    contexts, arm_features, mask = _validated(net, contexts, data, candidates, arm_features)
    batch_idx, arms = mask.nonzero(as_tuple=True)  # (P,), (P,)
    steps = minibatch_indices(len(data.sample), config, generator)
    weights = regulariser_weights(data, arms, config)  # (P,)
    sample = data.sample.to(device, dtype)  # no copy when already there
    if arm_features is not None:
        arm_features = arm_features.to(device, dtype)
    objective = _Objective(net, sample, arm_features, config, steps)
    mean, bonus = [], []
    for start in range(0, arms.numel(), config.chunk_size):
        chunk = slice(start, start + config.chunk_size)
        pair_x = contexts[batch_idx[chunk]].to(device, dtype)  # (P, D)
        pair_arm = arms[chunk].to(device)  # (P,)
        f0, gain = objective.ascend(theta, pair_x, pair_arm, weights[chunk].to(device, dtype))
        mean.append(f0)
        bonus.append(config.bonus_scale * gain.clamp(min=0).sqrt())
    return _scatter(mask, batch_idx, arms, mean, bonus, device, dtype)


class _Objective:
    """The per-pair ascent objective and its batched gradient steps (internal)."""

    def __init__(
        self,
        net: RewardNet,
        sample: Transitions,
        arm_features: Tensor | None,
        config: RofuConfig,
        steps: Tensor | None,
    ) -> None:
        self.net, self.arm_features, self.config = net, arm_features, config
        self.sample, self.steps = sample, steps
        self.pair_grad = vmap(grad(self._loss), in_dims=(0, 0, 0, 0, 0, None, None, None))
        self.pair_value = vmap(self._value, in_dims=(0, 0, 0))
        self.value_grad = vmap(grad(self._value), in_dims=(None, 0, 0))
        self.mse_grad = grad(self._mse)

    def _predict(self, params: Params, x: Tensor, arms: Tensor) -> Tensor:
        out: Tensor = functional_call(self.net, params, (x, arms, self.arm_features))
        return out  # (N,)

    def _value(self, params: Params, x: Tensor, arm: Tensor) -> Tensor:
        return self._predict(params, x[None], arm[None])[0]  # ()

    def _mse(self, params: Params, dx: Tensor, da: Tensor, dr: Tensor) -> Tensor:
        return (self._predict(params, dx, da) - dr).square().mean()

    def _loss(
        self,
        params: Params,
        x: Tensor,
        arm: Tensor,
        inv_scale: Tensor,
        l2_scale: Tensor,
        dx: Tensor,
        da: Tensor,
        dr: Tensor,
    ) -> Tensor:
        # One forward over [query; minibatch]: a single functional_call per step.
        pred = self._predict(params, torch.cat([x[None], dx]), torch.cat([arm[None], da]))
        loss = (pred[1:] - dr).square().mean() - inv_scale * pred[0]  # (m+1,) -> ()
        if self.config.l2 > 0:
            loss = loss + l2_scale * sum(p.square().sum() for p in params.values())
        return loss

    def _rows(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        sample = self.sample
        if self.steps is None:
            return sample.x, sample.arms, sample.rewards
        rows = self.steps[step].to(sample.x.device)
        return sample.x[rows], sample.arms[rows], sample.rewards[rows]

    def ascend(
        self, theta: Params, x: Tensor, arm: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Run M steps for P pairs; returns (f at theta, the gain g is applied to), (P,)."""
        config = self.config
        f0 = self.pair_value(_expand(theta, x.shape[0]), x, arm)  # (P,)
        if config.steps == 0:
            return f0, torch.zeros_like(f0)
        shared = self.mse_grad(theta, *self._rows(0))  # regulariser gradient at theta
        value = self.value_grad(theta, x, arm)  # (P, ...) per-pair gradients of f
        inv_scale = 1.0 / (config.eta * weight)  # (P,)
        pushed = self._trajectory(theta, shared, value, inv_scale, config.l2 / weight, x, arm)
        if config.baseline == "start":
            return f0, self.pair_value(pushed, x, arm) - f0
        # The same steps (same minibatches) without the optimism term, one trajectory per
        # distinct regulariser weight: f moves along it only because R's own descent does.
        weights, group = torch.unique(weight, return_inverse=True)  # (U,), (P,)
        units = weights.numel()
        drift = self._trajectory(
            theta,
            shared,
            None,
            torch.zeros_like(weights),
            config.l2 / weights,
            x[:1].expand(units, -1),
            arm[:1].expand(units),
        )
        baseline = self.pair_value({k: v[group] for k, v in drift.items()}, x, arm)  # (P,)
        return f0, self.pair_value(pushed, x, arm) - baseline

    def _trajectory(
        self,
        theta: Params,
        shared: Params,
        value: Params | None,
        inv_scale: Tensor,
        l2_scale: Tensor,
        x: Tensor,
        arm: Tensor,
    ) -> Params:
        """M gradient steps from theta for P pairs (no optimism term when `value` is None)."""
        config = self.config
        params = {}
        for name, p in theta.items():
            step = shared[name] + _col(2 * l2_scale, p) * p  # (P, ...) by broadcasting
            if value is not None:
                step = step - _col(inv_scale, p) * value[name]
            params[name] = p - config.step_size * step
        for index in range(1, config.steps):
            kappa = config.step_size * config.step_decay**index
            grads = self.pair_grad(params, x, arm, inv_scale, l2_scale, *self._rows(index))
            params = {name: p - kappa * grads[name] for name, p in params.items()}
        return params


def _col(per_pair: Tensor, like: Tensor) -> Tensor:
    """(P,) -> (P, 1, ..., 1) broadcastable against a (P, ...) parameter."""
    return per_pair.view(-1, *([1] * like.dim()))


def _expand(theta: Params, pairs: int) -> Params:
    return {name: p.expand(pairs, *p.shape) for name, p in theta.items()}


def _parameters(net: RewardNet, params: Params | None) -> Params:
    if not isinstance(net, RewardNet):
        raise TypeError(f"net must be a RewardNet, got {type(net).__name__}")
    source = params if params is not None else dict(net.named_parameters())
    expected = {name for name, _ in net.named_parameters()}
    if set(source) != expected:
        raise ValueError(f"params must have exactly the keys {sorted(expected)}")
    return {name: p.detach() for name, p in source.items()}


def _validated(
    net: RewardNet,
    contexts: Tensor,
    data: RegulariserData,
    candidates: Tensor | None,
    arm_features: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    cfg = net.config
    contexts = check_float_tensor("contexts", contexts, ndim=2, size={1: cfg.context_dim})
    if cfg.per_arm_outputs:
        if arm_features is not None:
            raise ValueError("arm_features must be None for a network with one output per arm")
    else:
        arm_features = check_float_tensor(
            "arm_features", arm_features, ndim=2, size={1: cfg.arm_feature_dim}
        )
    n_arms = net.arm_count(arm_features)
    if not isinstance(data, RegulariserData):
        raise TypeError(f"data must be RegulariserData, got {type(data).__name__}")
    if len(data.sample) == 0:
        raise ValueError("data.sample is empty: ROFU needs at least one logged transition")
    if data.sample.x.shape[1] != cfg.context_dim:
        raise ValueError(f"data.sample.x must have {cfg.context_dim} features")
    if int(data.sample.arms.max()) >= n_arms:
        raise ValueError(f"data.sample.arms refers to an arm >= {n_arms}, the number of arms")
    shape = (contexts.shape[0], n_arms)
    if candidates is None:
        return contexts, arm_features, torch.ones(shape, dtype=torch.bool)
    mask = require_tensor("candidates", candidates).cpu()
    return contexts, arm_features, check_mask_tensor("candidates", mask, shape)


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
