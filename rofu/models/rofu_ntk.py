"""NTK-ROFU: the M ascent steps on f's first-order expansion around theta (paper, appendix).

With f~(u; theta + d) = f(u; theta) + g(u) . d, every step's gradient is a combination of
the query's gradient g_q, theta itself (the l2 term) and the minibatch rows' gradients
g_i, so the iterate stays in their span:

    d_j = a_j g_q + c_j theta + sum_{k<j} J_k^T b_k,     J_k: (m, P) rows of step k.

The steps then run on the coefficients (a, c, b), and need only inner products: the
kernel K(u, v) = g(u) . g(v) between rows and queries, g . theta and |g_q|^2. For a
`RewardNet` these come from the rank-one layer gradients, grad_{W_l} f(u) =
delta_l(u) h_{l-1}(u)^T, so K(u, v) = sum_l (delta_l(u) . delta_l(v)) (h_{l-1}(u) . h_{l-1}(v)
+ 1 with a bias); any other `RewardModel` (a CNN, a ResNet) uses explicit per-row
gradients from torch.func, (N, P) for N rows and P parameters.

What depends only on the checkpoint and the minibatches (the rows' features, their
residuals and the kernel blocks K_jk, k < j) is an `NtkBasis`, built once by
`prepare_ntk`; scoring a context then costs O(A m sum(widths) + M A m^2).

Noise (`RofuConfig.noise`, `rofu.models.scaling`): the steps run with eta / (2 sigma^2) and
2 sigma^2 l2 in place of eta and l2, i.e. on f~ - eta (w MSE~ / (2 sigma^2) + l2 |theta|^2);
with the `drift` baseline the gain is then exactly 2 sigma^2 times that of the same steps
on f~ - eta (w MSE~ + 2 sigma^2 l2 |theta|^2).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from rofu.models.data import RegulariserData, feature_rows
from rofu.models.networks import ACTIVATION_GRADS, ACTIVATIONS, RewardNet
from rofu.models.rofu_config import RofuConfig, minibatch_indices

Params = dict[str, Tensor]


@dataclass(frozen=True)
class Features:
    """Gradient features of N points at theta, in rank-one or explicit form.

    Attributes:
        value: (N,) f(u; theta).
        theta_dot: (N,) g(u) . theta.
        h: per layer, (C, I_l) layer inputs (rank-one form); `owner` maps points to rows.
        delta: per layer, (N, O_l) gradients of f with respect to the layer's output.
        owner: (N,) row of `h` each point reads, or None when h has one row per point.
        bias: whether the layers have biases (adds 1 to every h . h').
        explicit: (N, P) flattened gradients (explicit form; then h and delta are empty).
    """

    value: Tensor
    theta_dot: Tensor
    h: tuple[Tensor, ...] = ()
    delta: tuple[Tensor, ...] = ()
    owner: Tensor | None = None
    bias: bool = False
    explicit: Tensor | None = None

    def kernel(self, other: Features) -> Tensor:
        """(N, N') gradient inner products g(u) . g(v)."""
        if self.explicit is not None and other.explicit is not None:
            return self.explicit @ other.explicit.T
        group = self._group() if other.owner is None else None
        out = None
        for h, d, h2, d2 in zip(self.h, self.delta, other.h, other.delta, strict=True):
            hh = h @ h2.T  # (C, C')
            if self.bias:
                hh = hh + 1.0
            if group is not None:  # point n reads row n // group: broadcast, no gather
                dd = d @ d2.T  # (N, N'), viewed as (C, group, N')
                grouped, weight = dd.view(hh.shape[0], group, -1), hh[:, None, :]
                if out is None:
                    out = dd
                    grouped.mul_(weight)
                else:
                    out.view_as(grouped).addcmul_(grouped, weight)
                continue
            if self.owner is not None:
                hh = hh[self.owner]
            if other.owner is not None:
                hh = hh[:, other.owner]
            term = (d @ d2.T) * hh  # (N, N')
            out = term if out is None else out + term
        assert out is not None
        return out

    def _group(self) -> int | None:
        """g when point n reads row n // g of h (every context with the same g points in
        a row, as when all arms are candidates), else None."""
        if self.owner is None or not self.h:
            return None
        rows, points = self.h[0].shape[0], self.owner.shape[0]
        if rows == 0 or points % rows:
            return None
        group = points // rows
        expected = torch.arange(rows, device=self.owner.device).repeat_interleave(group)
        return group if torch.equal(self.owner, expected) else None

    def slice(self, lo: int, hi: int) -> Features:
        """Points lo:hi (of features with one row of h per point)."""
        if self.owner is not None:
            raise ValueError("slice needs features with one row of h per point")
        explicit = None if self.explicit is None else self.explicit[lo:hi]
        return Features(
            value=self.value[lo:hi],
            theta_dot=self.theta_dot[lo:hi],
            h=tuple(h[lo:hi] for h in self.h),
            delta=tuple(d[lo:hi] for d in self.delta),
            bias=self.bias,
            explicit=explicit,
        )

    def square_norm(self) -> Tensor:
        """(N,) |g(u)|^2."""
        if self.explicit is not None:
            return self.explicit.square().sum(dim=1)
        out = torch.zeros_like(self.value)
        for h, d in zip(self.h, self.delta, strict=True):
            hh = h.square().sum(dim=1) + (1.0 if self.bias else 0.0)  # (C,)
            out = out + d.square().sum(dim=1) * (hh if self.owner is None else hh[self.owner])
        return out


@dataclass(frozen=True)
class NtkBasis:
    """What NTK-ROFU needs from a checkpoint and its minibatches, computed once.

    The rows of every step are stacked (entry e holds columns offsets[e]:offsets[e+1];
    one entry when every step uses the whole sample, else one per step).

    Attributes:
        rows: features of the stacked rows, (R,) points.
        residual: (R,) f(theta) - r.
        offsets: entry boundaries, len(entries) + 1.
        gram: per entry e, the kernel between the rows already carrying coefficients when
            it is used and its own rows, laid out for the coefficient step's product:
            (offsets[e], m_e) for minibatches (the earlier steps' rows), (N, N) for the
            whole sample.
    """

    rows: Features
    residual: Tensor
    offsets: tuple[int, ...]
    gram: tuple[Tensor, ...]

    def entry(self, step: int) -> int:
        """The entry of the rows a step uses."""
        return min(step, len(self.offsets) - 2)

    def known(self, step: int) -> int:
        """How many leading columns carry coefficients when `step` starts."""
        if len(self.offsets) == 2:  # the whole sample: all of it after the first step
            return self.offsets[1] if step > 0 else 0
        return self.offsets[step]


def features(
    net: nn.Module,
    theta: Params,
    x: Tensor,
    arms: Tensor,
    arm_features: Tensor | None,
    owner: Tensor | None = None,
) -> Features:
    """Gradient features of (context, arm) points: rank-one for a RewardNet, else explicit.

    Args:
        x: (C, *context_shape) contexts; with `owner`, point n is (x[owner[n]], arms[n]).
        arms: (N,) arms.
        owner: (N,) context of each point, or None for one point per row of x.
    """
    if isinstance(net, RewardNet):
        return _rank_one(net, theta, x, arms, arm_features, owner)
    if owner is not None:
        x = x[owner]
    return _explicit(net, theta, x, arms, arm_features)


def _rank_one(
    net: RewardNet,
    theta: Params,
    x: Tensor,
    arms: Tensor,
    arm_features: Tensor | None,
    owner: Tensor | None,
) -> Features:
    per_arm = net.config.per_arm_outputs
    if not per_arm and owner is not None:  # the input depends on the arm: one row per point
        x, owner = x[owner], None
    act, act_grad = ACTIVATIONS[net.config.activation], ACTIVATION_GRADS[net.config.activation]
    count = len(net.layers)
    weights = [theta[f"layers.{i}.weight"] for i in range(count)]
    biases = [theta.get(f"layers.{i}.bias") for i in range(count)]
    h = net.inputs(x, arms, arm_features)  # (C, I0)
    hs, zs = [], []
    for w, b in zip(weights, biases, strict=True):
        hs.append(h)
        z = h @ w.T if b is None else torch.addmm(b, h, w.T)  # (C, O)
        zs.append(z)
        h = act(z)
    unit = arms if per_arm else torch.zeros_like(arms)

    def pick(t: Tensor) -> Tensor:
        return t if owner is None else t[owner]

    out = pick(zs[-1])  # (N, O_L)
    delta = torch.zeros_like(out).scatter_(1, unit[:, None], 1.0)  # (N, O_L)
    deltas = [delta]
    for index in range(count - 1, 0, -1):
        upstream = delta @ weights[index]  # (N, I)
        if net.config.activation == "relu":  # the fused kernel of ReLU's own backward
            delta = torch.ops.aten.threshold_backward(upstream, pick(hs[index]), 0.0)
        else:
            delta = upstream * act_grad(pick(zs[index - 1]), pick(hs[index]))
        deltas.append(delta)
    deltas.reverse()
    theta_dot = torch.stack([(d * pick(z)).sum(dim=1) for d, z in zip(deltas, zs, strict=True)])
    return Features(
        value=out.gather(1, unit[:, None])[:, 0],
        theta_dot=theta_dot.sum(dim=0),
        h=tuple(hs),
        delta=tuple(deltas),
        owner=owner,
        bias=biases[0] is not None,
    )


def _explicit(
    net: nn.Module, theta: Params, x: Tensor, arms: Tensor, arm_features: Tensor | None
) -> Features:
    def value(params: Params, xi: Tensor, ai: Tensor) -> Tensor:
        out: Tensor = functional_call(net, params, (xi[None], ai[None], arm_features))
        return out[0]

    grads = vmap(grad(value), in_dims=(None, 0, 0))(theta, x, arms)
    flat = torch.cat([grads[name].flatten(1) for name in theta], dim=1)  # (N, P)
    flat_theta = torch.cat([p.flatten() for p in theta.values()])  # (P,)
    with torch.no_grad():
        values: Tensor = functional_call(net, theta, (x, arms, arm_features))
    return Features(value=values, theta_dot=flat @ flat_theta, explicit=flat)


def prepare_ntk(
    net: nn.Module,
    theta: Params,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    arm_features: Tensor | None,
) -> NtkBasis:
    """The basis for one checkpoint: draws the M minibatches from `generator` as the exact
    estimator does, then the rows' features, residuals and kernel blocks."""
    rows, residual, offsets = step_rows(net, theta, data, config, generator, arm_features)
    if len(offsets) == 2:  # the whole sample at every step (or M = 1: no block is read)
        gram: tuple[Tensor, ...] = (rows.kernel(rows) if config.steps > 1 else rows.value[:0],)
    else:  # only the blocks the steps use: rows of step e against those of steps < e
        gram = tuple(
            rows.slice(0, lo).kernel(rows.slice(lo, hi)) for lo, hi in itertools.pairwise(offsets)
        )
    return NtkBasis(rows, residual, offsets, gram)


def step_rows(
    net: nn.Module,
    theta: Params,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    arm_features: Tensor | None,
) -> tuple[Features, Tensor, tuple[int, ...]]:
    """The rows the M steps use, drawn from `generator` as the exact estimator draws them,
    stacked: their features, their residuals f(theta) - r, (R,), and the entry offsets
    (one entry when every step uses the whole sample, else one per step)."""
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    sample = data.sample.to(device, dtype)
    steps = minibatch_indices(len(sample), config, generator)
    if steps is None:
        parts = sample
        offsets: tuple[int, ...] = (0, len(sample))
    else:
        parts = sample.subset(steps.flatten().to(device))
        offsets = tuple(steps.shape[1] * e for e in range(steps.shape[0] + 1))
    index, table = feature_rows(parts.arms, parts.features, arm_features)
    rows = features(net, theta, parts.x, index, table)
    return rows, rows.value - parts.rewards, offsets


def ntk_gains(
    basis: NtkBasis, query: Features, weight: Tensor, config: RofuConfig
) -> tuple[Tensor, Tensor]:
    """(f at theta, the gain g is applied to) for P query pairs, each (P,).

    `start`: g_q . d_M. `drift`: g_q . (d_M - d~_M), where d~ takes the same steps without
    the optimism term; the residual and l2 pulls cancel, so it runs without them.
    """
    f0 = query.value
    if config.steps == 0:
        return f0, torch.zeros_like(f0)
    start = config.baseline == "start"
    cross = query.kernel(basis.rows)  # (P, R)
    shrink = config.l2 / weight  # (P,) lambda
    push = 1.0 / (config.eta * weight)  # (P,) s
    a, c = torch.zeros_like(f0), torch.zeros_like(f0)
    coeffs = torch.zeros_like(cross)  # b, (P, R): d = a g_q + c theta + J^T b
    for j in range(config.steps):
        kappa = config.step_size * config.step_decay**j
        entry, known = basis.entry(j), basis.known(j)
        lo, hi = basis.offsets[entry], basis.offsets[entry + 1]
        moved = a[:, None] * cross[:, lo:hi]  # (P, m): J_j d_j
        if known:
            moved = torch.addmm(moved, coeffs[:, :known], basis.gram[entry][:known])
        if start:
            theta_dot, residual = basis.rows.theta_dot[lo:hi], basis.residual[lo:hi]
            moved = moved + c[:, None] * theta_dot + residual
        if config.l2:  # the l2 pull shrinks d and adds -theta's direction
            decay = 1.0 - 2.0 * kappa * shrink  # (P,)
            coeffs[:, :known] *= decay[:, None]
            a, c = decay * a, decay * c - 2.0 * kappa * shrink
        coeffs[:, lo:hi] -= (2.0 * kappa / (hi - lo)) * moved
        a = a + kappa * push
    gain = a * query.square_norm() + torch.linalg.vecdot(cross, coeffs)
    if start:
        gain = gain + c * query.theta_dot
    return f0, gain
