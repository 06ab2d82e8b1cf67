"""Closed-form NTK-ROFU: the maximiser of the linearised objective, solved exactly.

The M ascent steps of `rofu.models.rofu_ntk` approach, as M grows with a stable step, the
maximiser of g_q . d - eta R~(theta + d) (paper, appendix, Eq. ntk-theta-hat). With the
`drift` baseline the residual and l2 pulls on theta cancel, and what is left is a quadratic
in d whose curvature is Gauss-Newton's,

    Z = lambda' I + J^T J / m,      lambda' = l2 / w,   J: (m, P) the sample's gradients,

so d* = Z^-1 g_q / (2 eta w) and the gain is g_q^T Z^-1 g_q / (2 eta w) (the appendix's
Eq. ntk-rofu; LinUCB's bonus for a linear model, paper Thm 1). By Woodbury, with the
sample's Gram K = J J^T (m, m) and k_q = J g_q (m,),

    gain = (|g_q|^2 - k_q^T (K + c I)^-1 k_q) / (2 eta l2),      c = m l2 / w,

and one eigendecomposition K = V diag(mu) V^T per checkpoint serves every weight w (one per
arm under `arm_count`): k_q^T (K + c I)^-1 k_q = sum_i (V^T k_q)_i^2 / (mu_i + c). No step
size, no stability cap, no M. Needs l2 > 0: without it Z is singular outside the sample's span.

Noise (`RofuConfig.noise`, `rofu.models.scaling`): with R's data term divided by 2 sigma^2
(eta -> eta / (2 sigma^2), l2 -> 2 sigma^2 l2) the gain is
2 sigma^2 g_q^T (2 sigma^2 l2 / w I + J^T J / m)^-1 g_q / (2 eta w), that is
(|g_q|^2 - k_q^T (K + 2 sigma^2 c I)^-1 k_q) / (2 eta l2): LinUCB's sigma^2 x^T (X^T X +
sigma^2 lambda I)^-1 x, a bonus that grows with sigma. sigma^2 = 1/2 is today's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rofu.models.data import RegulariserData, feature_rows
from rofu.models.rofu_config import RofuConfig
from rofu.models.rofu_ntk import Features, Params, features

#: Eigenvalues of K below this fraction of the largest count as outside the sample's span.
SPAN_TOLERANCE = 1e-10


@dataclass(frozen=True)
class ClosedBasis:
    """The sample's gradient features and its Gram's eigendecomposition, in float64.

    Attributes:
        rows: features of the m sample rows.
        eigenvalues: (m,) mu, clamped at 0.
        eigenvectors: (m, m) V, K = V diag(mu) V^T.
    """

    rows: Features
    eigenvalues: Tensor
    eigenvectors: Tensor

    @property
    def size(self) -> int:
        """m, the rows the curvature is estimated on."""
        return int(self.eigenvalues.shape[0])


def check_closed(config: RofuConfig) -> None:
    """The closed form's own requirement, named.

    Raises:
        ValueError: when l2 is not positive.
    """
    if not config.l2 > 0:
        raise ValueError(
            f"l2 must be > 0 for the closed-form estimator (the prior's precision), got {config.l2}"
        )


def prepare_closed(
    net: nn.Module,
    theta: Params,
    data: RegulariserData,
    config: RofuConfig,
    generator: torch.Generator,
    arm_features: Tensor | None,
) -> ClosedBasis:
    """The basis for one checkpoint: the features of the data sample's rows (at most
    `config.closed_rows` of them, drawn from `generator`) and one eigh of their Gram."""
    check_closed(config)
    device, dtype = next(iter(theta.values())).device, next(iter(theta.values())).dtype
    sample = data.sample.to(device, dtype)
    if config.closed_rows is not None and len(sample) > config.closed_rows:
        rows_drawn = torch.randperm(len(sample), generator=generator)[: config.closed_rows]
        sample = sample.subset(rows_drawn.to(device))
    index, table = feature_rows(sample.arms, sample.features, arm_features)
    rows = features(net, theta, sample.x, index, table)
    gram = rows.kernel(rows).to(torch.float64)  # (m, m)
    gram = 0.5 * (gram + gram.T)
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    return ClosedBasis(rows, eigenvalues.clamp_min(0.0), eigenvectors)


def closed_gains(
    basis: ClosedBasis, query: Features, weight: Tensor, config: RofuConfig
) -> tuple[Tensor, Tensor]:
    """(f at theta, the gain g is applied to) for P query pairs, each (P,).

    Args:
        weight: (P,) w of each pair (|D| or n_a + 1, `regulariser_weights`).
    """
    f0 = query.value
    norm = query.square_norm().to(torch.float64)  # (P,) |g_q|^2
    if basis.size == 0:
        return f0, (norm / (2.0 * config.eta * config.l2)).to(f0.dtype)
    projected = query.kernel(basis.rows).to(torch.float64) @ basis.eigenvectors  # (P, m)
    shift = basis.size * config.l2 / weight.to(torch.float64)  # (P,) c
    inside = (projected.square() / (basis.eigenvalues + shift[:, None])).sum(dim=1)  # (P,)
    gain = (norm - inside).clamp_min(0.0) / (2.0 * config.eta * config.l2)
    return f0, gain.to(f0.dtype)


def span_share(basis: ClosedBasis, query: Features) -> Tensor:
    """(P,) the share of each query's |g_q|^2 inside the span of the sample's gradients.

    The rest is where only the prior acts, so a bonus made mostly of it is a count bonus.
    """
    norm = query.square_norm().detach().to(torch.float64)
    if basis.size == 0:
        return torch.zeros_like(norm)
    projected = query.kernel(basis.rows).detach().to(torch.float64) @ basis.eigenvectors
    keep = basis.eigenvalues > SPAN_TOLERANCE * basis.eigenvalues.max().clamp_min(1e-300)
    inside = (projected[:, keep].square() / basis.eigenvalues[keep]).sum(dim=1)
    return (inside / norm.clamp_min(1e-300)).clamp(0.0, 1.0)
