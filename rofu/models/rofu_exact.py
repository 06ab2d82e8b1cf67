"""ROFU's exact estimator for a `RewardNet`, with a hand-written batched forward/backward.

The same M gradient steps as `rofu.models.rofu_functional` (and the naive loop), without
torch.func dispatch in the hot loop: per-pair parameters are stacked, (P, O, I) per layer,
and every layer is one `bmm`/`baddbmm` over the pairs. What does not depend on the pair
is computed once: step 0's regulariser gradient (every pair still sits at theta) and the
first layer's product with the minibatch rows is a single broadcast matmul. Parameters
are updated in place; the last step forms no weight gradient (theta_M's output at the
query follows from that step's deltas and input products); pairs run in chunks of
`rofu.models.rofu.chunk_pairs`.

Noise (`RofuConfig.noise`, `rofu.models.scaling`): each step descends
MSE + (l2 / w) |theta|^2 - f / (eta w) with eta and l2 as resolved, so under
`prequential` it descends MSE + (2 sigma^2 l2 / w) |theta|^2 - 2 sigma^2 f / (eta w):
R's data term divided by 2 sigma^2, the prior kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.data import Transitions, feature_rows
from rofu.models.networks import ACTIVATION_GRADS, ACTIVATIONS, RewardNet
from rofu.models.rofu_config import RofuConfig

#: Per layer: weight (O, I) or stacked (P, O, I), and bias (O,) / (P, O) or None.
Layers = list[tuple[Tensor, Tensor | None]]
Params = dict[str, Tensor]


@dataclass(frozen=True)
class _Rows:
    """One step's minibatch as network inputs: (m, I0) inputs, (m,) output unit, rewards."""

    inputs: Tensor
    unit: Tensor
    rewards: Tensor


class ExactAscent:
    """M steps of ascent for P pairs of one call, on a `RewardNet`'s own structure."""

    def __init__(
        self,
        net: RewardNet,
        sample: Transitions,
        arm_features: Tensor | None,
        config: RofuConfig,
        steps: Tensor | None,
    ) -> None:
        self.net, self.config = net, config
        # Rows with their own arm features read them from the end of the table.
        index, self.arm_features = feature_rows(sample.arms, sample.features, arm_features)
        self.act: Callable[[Tensor], Tensor] = ACTIVATIONS[net.config.activation]
        self.act_grad = ACTIVATION_GRADS[net.config.activation]
        self.per_arm = net.config.per_arm_outputs
        if steps is None:
            self.rows = [self._step_rows(sample, index, None)]  # the whole sample every step
        else:
            self.rows = [self._step_rows(sample, index, rows) for rows in steps]

    def _step_rows(self, sample: Transitions, index: Tensor, rows: Tensor | None) -> _Rows:
        # Plain indexing, no Transitions (whose checks read values back to the host), so
        # that a CUDA graph can capture this (rofu.models.rofu_graphs).
        x, arms, rewards = sample.x, sample.arms, sample.rewards
        if rows is not None:
            rows = rows.to(x.device)
            x, arms, index, rewards = x[rows], arms[rows], index[rows], rewards[rows]
        inputs = self.net.inputs(x, index, self.arm_features)  # (m, I0)
        return _Rows(inputs, self._unit(arms), rewards)

    def _unit(self, arms: Tensor) -> Tensor:
        """The output unit a (context, arm) pair reads: its arm, or the single output."""
        return arms if self.per_arm else torch.zeros_like(arms)

    def _rows_at(self, step: int) -> _Rows:
        return self.rows[min(step, len(self.rows) - 1)]

    def ascend(
        self, theta: Params, x: Tensor, arm: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Run M steps for P pairs; returns (f at theta, the gain g is applied to), (P,)."""
        config = self.config
        layers = _layers(theta, len(self.net.layers))
        query = self.net.inputs(x, arm, self.arm_features)  # (P, I0)
        unit = self._unit(arm)  # (P,)
        f0 = self.values(layers, query, unit)
        if config.steps == 0:
            return f0, torch.zeros_like(f0)
        inv_scale = 1.0 / (config.eta * weight)  # (P,)
        pushed = self.pushed_values(layers, query, unit, inv_scale, config.l2 / weight)
        if config.baseline == "start":
            return f0, pushed - f0
        # The same steps without the optimism term: one trajectory per distinct weight,
        # or a single one without l2, where the weight no longer enters the steps.
        if config.l2 == 0:
            weights, group = weight[:1], torch.zeros_like(unit)
        else:
            weights, group = torch.unique(weight, return_inverse=True)  # (U,), (P,)
        units = weights.numel()
        drift = self.trajectory(
            layers,
            query[:1].expand(units, -1),
            unit[:1].expand(units),
            torch.zeros_like(weights),
            config.l2 / weights,
        )
        drift_pairs = [(w[group], None if b is None else b[group]) for w, b in drift]
        return f0, pushed - self.values(drift_pairs, query, unit)

    def values(self, layers: Layers, query: Tensor, unit: Tensor) -> Tensor:
        """f of each pair's query under shared (2-d) or per-pair (3-d) weights: (P,)."""
        h = query[:, None, :]  # (P, 1, I0)
        last = len(layers) - 1
        for index, (w, b) in enumerate(layers):
            h = torch.matmul(h, w.mT)  # (P, 1, O)
            if b is not None:
                h = h + (b[:, None, :] if b.dim() == 2 else b)
            if index < last:
                h = self.act(h)
        return h[:, 0, :].gather(1, unit[:, None])[:, 0]  # (P,)

    def pushed_values(
        self, layers: Layers, query: Tensor, unit: Tensor, inv_scale: Tensor, l2_scale: Tensor
    ) -> Tensor:
        """f(theta_M) of each pair's query, (P,). The last step's update is never formed:
        W_M u = decay W u - kappa sum_r delta[r] (in[r] . u) needs no weight gradient."""
        steps = self.config.steps
        if steps == 1:
            return self.values(
                self.trajectory(layers, query, unit, inv_scale, l2_scale), query, unit
            )
        params = self.trajectory(layers, query, unit, inv_scale, l2_scale, steps=steps - 1)
        kappa = self.config.step_size * self.config.step_decay ** (steps - 1)
        hs, deltas, rows = self._deltas(params, query, unit, inv_scale, steps - 1)
        decay = (1.0 - 2.0 * kappa * l2_scale)[:, None]  # (P, 1)
        bias = 1.0 if params[0][1] is not None else 0.0
        u, last = query, len(params) - 1
        for index, (w, b) in enumerate(params):
            base = torch.bmm(w, u[:, :, None])[..., 0]  # (P, O)
            if b is not None:
                base = base + b
            if index == 0:  # the rows' inputs: [query; minibatch], (P, 1+m)
                dots = (u * query).sum(dim=1, keepdim=True)
                if rows is not None and rows.unit.numel():
                    dots = torch.cat([dots, u @ rows.inputs.T], dim=1)
            else:
                dots = torch.bmm(hs[index - 1], u[:, :, None])[..., 0]
            change = torch.bmm(deltas[index].mT, (dots + bias)[:, :, None])[..., 0]  # (P, O)
            z = decay * base - kappa * change
            u = z if index == last else self.act(z)
        return u.gather(1, unit[:, None])[:, 0]

    def trajectory(
        self,
        layers: Layers,
        query: Tensor,
        unit: Tensor,
        inv_scale: Tensor,
        l2_scale: Tensor,
        steps: int | None = None,
    ) -> Layers:
        """`steps` (default M) steps from theta for P pairs; `inv_scale` 0 drops the
        optimism term."""
        config, pairs = self.config, query.shape[0]
        kappa = config.step_size
        shared = self.gradients(_stacked(layers, 1), query[:1], unit[:1], query.new_zeros(1), 0)
        push = self.gradients(_stacked(layers, pairs), query, unit, inv_scale, None)
        decay = 1.0 - 2.0 * kappa * l2_scale  # (P,)
        params: Layers = []
        for (w, b), (sw, sb), (pw, pb) in zip(layers, shared, push, strict=True):
            new_w = w * _col(decay, 3) - kappa * (sw + pw)  # (P, O, I)
            new_b = None
            if b is not None and sb is not None and pb is not None:
                new_b = b * _col(decay, 2) - kappa * (sb + pb)  # (P, O)
            params.append((new_w, new_b))
        for index in range(1, config.steps if steps is None else steps):
            kappa = config.step_size * config.step_decay**index
            grads = self.gradients(params, query, unit, inv_scale, index)
            decay = 1.0 - 2.0 * kappa * l2_scale
            for (w, b), (gw, gb) in zip(params, grads, strict=True):
                w.mul_(_col(decay, 3)).sub_(kappa * gw)
                if b is not None and gb is not None:
                    b.mul_(_col(decay, 2)).sub_(kappa * gb)
        return params

    def gradients(
        self,
        layers: Layers,
        query: Tensor,
        unit: Tensor,
        inv_scale: Tensor,
        step: int | None,
    ) -> list[tuple[Tensor, Tensor | None]]:
        """Per-pair gradient of MSE(step's rows) - inv_scale * f(query), weights (P, O, I).

        `step` None leaves the regulariser out (the query's own gradient only).
        """
        hs, deltas, rows = self._deltas(layers, query, unit, inv_scale, step)
        grads: list[tuple[Tensor, Tensor | None]] = []
        for index, ((_, b), delta) in enumerate(zip(layers, deltas, strict=True)):
            if index:
                weight = torch.bmm(delta.mT, hs[index - 1])  # (P, O, I)
            else:  # the query row's input is the pair's own, the rows' are shared
                weight = delta[:, 0, :, None] * query[:, None, :]  # (P, O, I0)
                if rows is not None and rows.unit.numel():
                    weight = weight + torch.matmul(delta[:, 1:, :].mT, rows.inputs)
            grads.append((weight, None if b is None else delta.sum(dim=1)))
        return grads

    def _deltas(
        self,
        layers: Layers,
        query: Tensor,
        unit: Tensor,
        inv_scale: Tensor,
        step: int | None,
    ) -> tuple[list[Tensor], list[Tensor], _Rows | None]:
        """Layer inputs h_l and the loss's gradients with respect to every layer's output
        (P, 1+m, O_l), over [query; step's rows]."""
        rows = None if step is None else self._rows_at(step)
        zs, hs = self._forward(layers, query, rows)
        pairs = query.shape[0]
        out = zs[-1]  # (P, 1+m, O_L)
        index = unit[:, None]  # (P, 1)
        upstream = (-inv_scale)[:, None]  # (P, 1) d loss / d f(query)
        if rows is not None and rows.unit.numel():
            index = torch.cat([index, rows.unit[None].expand(pairs, -1)], dim=1)  # (P, 1+m)
            pred = out[:, 1:, :].gather(2, index[:, 1:, None])[..., 0]  # (P, m)
            residual = (2.0 / rows.unit.numel()) * (pred - rows.rewards)  # (P, m)
            upstream = torch.cat([upstream, residual], dim=1)  # (P, 1+m)
        delta = torch.zeros_like(out).scatter_(2, index[..., None], upstream[..., None])
        deltas = [delta]
        for layer in range(len(layers) - 1, 0, -1):
            upstream_h = torch.bmm(delta, layers[layer][0])  # (P, 1+m, I)
            delta = self._through_activation(upstream_h, zs[layer - 1], hs[layer - 1])
            deltas.append(delta)
        return hs, deltas[::-1], rows

    def _forward(
        self, layers: Layers, query: Tensor, rows: _Rows | None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Pre-activations z_l (P, 1+m, O_l) and hidden outputs h_l of [query; rows]."""
        w, b = layers[0]
        z = torch.bmm(query[:, None, :], w.mT)  # (P, 1, O)
        if rows is not None and rows.unit.numel():
            z = torch.cat([z, torch.matmul(rows.inputs, w.mT)], dim=1)  # (P, 1+m, O)
        if b is not None:
            z = z + b[:, None, :]
        zs, hs = [z], []
        for w, b in layers[1:]:
            h = self.act(zs[-1])
            hs.append(h)
            zs.append(torch.bmm(h, w.mT) if b is None else torch.baddbmm(b[:, None, :], h, w.mT))
        return zs, hs

    def _through_activation(self, upstream: Tensor, z: Tensor, h: Tensor) -> Tensor:
        """upstream * act'(z); ReLU's by the fused kernel its own backward uses."""
        if self.act is torch.relu:
            return torch.ops.aten.threshold_backward(upstream, h, 0.0)  # type: ignore[no-any-return]
        return upstream * self.act_grad(z, h)


def _layers(theta: Params, count: int) -> Layers:
    return [(theta[f"layers.{i}.weight"], theta.get(f"layers.{i}.bias")) for i in range(count)]


def _stacked(layers: Layers, pairs: int) -> Layers:
    """Shared (O, I) layers as (P, O, I) views, or per-pair layers as they are."""
    if layers[0][0].dim() == 3:
        return layers
    return [
        (w.expand(pairs, *w.shape), None if b is None else b.expand(pairs, *b.shape))
        for w, b in layers
    ]


def _col(per_pair: Tensor, dims: int) -> Tensor:
    """(P,) -> (P, 1, ...) with `dims` dimensions in all."""
    return per_pair.view(-1, *([1] * (dims - 1)))
