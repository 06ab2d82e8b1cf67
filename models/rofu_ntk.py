"""NTK-ROFU: the M ascent steps on f's first-order expansion around theta (paper, appendix).

With f~(u; theta + d) = f(u; theta) + g(u) . d, every step's gradient is a combination of
the query's gradient g_q, theta itself (the l2 term) and the minibatch rows' gradients
g_i, so the iterate stays in their span:

    d_j = a_j g_q + c_j theta + sum_{k<j} J_k^T b_k,     J_k: (m, P) rows of step k.

The steps then run on the coefficients (a, c, b), and need only inner products: the
kernel K(u, v) = g(u) . g(v) between rows and queries, g . theta and |g_q|^2. For a
`RewardNet` these come from the rank-one layer gradients, grad_{W_l} f(u) =
delta_l(u) h_{l-1}(u)^T, so K(u, v) = sum_l (delta_l(u) . delta_l(v)) (h_{l-1}(u) . h_{l-1}(v)
+ 1 with a bias); any other model uses explicit per-row gradients from torch.func.

What depends only on the checkpoint and the minibatches (the rows' features, their
residuals and the kernel blocks K_jk, k < j) is an `NtkBasis`, built once by
`prepare_ntk`; scoring a context then costs O(A m sum(widths) + M A m^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from models.data import RegulariserData, Transitions
from models.networks import ACTIVATION_GRADS, ACTIVATIONS, RewardNet
from models.rofu_config import RofuConfig, minibatch_indices

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
        out = None
        for h, d, h2, d2 in zip(self.h, self.delta, other.h, other.delta, strict=True):
            hh = h @ h2.T  # (C, C')
            if self.bias:
                hh = hh + 1.0
            if self.owner is not None:
                hh = hh[self.owner]
            if other.owner is not None:
                hh = hh[:, other.owner]
            term = (d @ d2.T) * hh  # (N, N')
            out = term if out is None else out + term
        assert out is not None
        return out

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

    Attributes:
        rows: per step, the features of that step's minibatch rows (one entry when every
            step uses the whole sample).
        residual: per entry of `rows`, (m,) f(theta) - r.
        gram: gram[j][k]: (m_j, m_k) kernel between the rows of entries j and k, for
            k < j (minibatches), or k = j = 0 (the whole sample, reused at every step).
        steps: M.
    """

    rows: tuple[Features, ...]
    residual: tuple[Tensor, ...]
    gram: tuple[tuple[Tensor, ...], ...]
    steps: int

    def at(self, step: int) -> int:
        """Index into `rows` for a step."""
        return min(step, len(self.rows) - 1)


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
        x: (C, D) contexts; with `owner`, point n is (x[owner[n]], arms[n]).
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
        delta = (delta @ weights[index]) * act_grad(pick(zs[index - 1]), pick(hs[index]))
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
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    sample = data.sample.to(device, dtype)
    steps = minibatch_indices(len(sample), config, generator)
    parts: list[Transitions] = (
        [sample] if steps is None else [sample.subset(r.to(device)) for r in steps]
    )
    rows = tuple(features(net, theta, p.x, p.arms, arm_features) for p in parts)
    residual = tuple(f.value - p.rewards for f, p in zip(rows, parts, strict=True))
    gram: tuple[tuple[Tensor, ...], ...] = ((),)
    if steps is None and config.steps > 1:  # every step reuses the whole sample: one block
        gram = ((rows[0].kernel(rows[0]),),)
    elif steps is not None:
        gram = tuple(tuple(rows[j].kernel(rows[k]) for k in range(j)) for j in range(len(rows)))
    return NtkBasis(rows=rows, residual=residual, gram=gram, steps=config.steps)


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
    cross = [rows.kernel(query).T for rows in basis.rows]  # per entry (P, m)
    shrink = config.l2 / weight  # (P,) lambda
    push = 1.0 / (config.eta * weight)  # (P,) s
    a, c = torch.zeros_like(f0), torch.zeros_like(f0)
    coeffs: dict[int, Tensor] = {}  # b per entry of basis.rows, (P, m_entry)
    for j in range(config.steps):
        kappa = config.step_size * config.step_decay**j
        entry = basis.at(j)
        moved = a[:, None] * cross[entry]  # (P, m): J_j d_j
        for k, b in coeffs.items():
            moved = moved + b @ basis.gram[entry][k].T
        if start:
            moved = moved + c[:, None] * basis.rows[entry].theta_dot + basis.residual[entry]
        decay = (1.0 - 2.0 * kappa * shrink)[:, None]  # (P, 1)
        coeffs = {k: b * decay for k, b in coeffs.items()}
        step = (-2.0 * kappa / moved.shape[1]) * moved
        coeffs[entry] = coeffs[entry] + step if entry in coeffs else step
        a = decay[:, 0] * a + kappa * push
        c = decay[:, 0] * c - 2.0 * kappa * shrink
    gain = a * query.square_norm()
    for k, b in coeffs.items():
        gain = gain + (cross[k] * b).sum(dim=1)
    if start:
        gain = gain + c * query.theta_dot
    return f0, gain
