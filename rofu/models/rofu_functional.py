"""ROFU's exact estimator through torch.func: functional_call + grad + vmap.

The general path: it works for any `RewardModel` (`rofu.models.reward_model`), whose forward is
`f(x, arms, arm_features) -> (N,)` on contexts of any shape, and it is the reference the
hand-written kernel (`rofu.models.rofu_exact`) is measured against. Parameters are ascended;
buffers (batch norm's running statistics, read in eval mode) come from the module itself.
All pairs run together; the first step, where every pair still sits at theta, shares one
regulariser gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from rofu.models.data import Transitions, feature_rows
from rofu.models.rofu_config import RofuConfig

Params = dict[str, Tensor]


class FunctionalAscent:
    """The per-pair ascent objective and its batched gradient steps, with torch.func."""

    def __init__(
        self,
        net: nn.Module,
        sample: Transitions,
        arm_features: Tensor | None,
        config: RofuConfig,
        steps: Tensor | None,
    ) -> None:
        self.net, self.config = net, config
        # Rows with their own arm features read them from the end of the table.
        self.index, self.arm_features = feature_rows(sample.arms, sample.features, arm_features)
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
        sample, index = self.sample, self.index
        if self.steps is None:
            return sample.x, index, sample.rewards
        rows = self.steps[step].to(sample.x.device)
        return sample.x[rows], index[rows], sample.rewards[rows]

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
            x[:1].expand(units, *x.shape[1:]),
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
