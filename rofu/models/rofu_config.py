"""ROFU's hyper-parameters and what every estimator shares: minibatches and weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rofu.models.data import RegulariserData
from rofu.models.hyper import check_hypers, hyper
from rofu.models.selection import SELECTIONS, SelectionRule

REGULARISERS = ("dataset", "arm_count")
BASELINES = ("start", "drift")
ESTIMATORS = ("exact", "ntk", "ntk-closed", "ntk-kfac")
NOISES = ("fixed", "prequential")
#: The estimators that solve the linearised objective exactly: no step, no M, and l2 > 0.
CLOSED_FORMS = ("ntk-closed", "ntk-kfac")


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
        chunk_size: pairs computed together; their working set is roughly
            chunk_size * minibatch_size * sum(hidden) * 16 bytes. None (the default)
            picks it for the device (`rofu.models.rofu.chunk_pairs`): on a CPU, as many pairs
            as keep an MLP's working set near `CHUNK_BYTES` (past the cache the kernel
            runs 1.5-3.5x slower; `rofu bench kernel`), elsewhere `MAX_CHUNK`. The
            results do not depend on it.
        baseline: what the gain g is applied to is measured against. `start` (the paper):
            f_theta_M(x, a) - f_theta(x, a). `drift`: f_theta_M(x, a) - f_theta~_M(x, a),
            where theta~ takes the same steps on the same minibatches without the
            optimism term; this removes the change in f that R's own descent causes when
            theta_{t-1} does not minimise R exactly (and equals `start` when it does).
        estimator: `exact` runs the M steps on the network itself; `ntk` runs the same
            steps on its first-order expansion around theta (the paper's NTK regulariser,
            appendix), in the span of the gradient features: far cheaper, and equal to
            `exact` for a model that is linear in its parameters. `ntk-closed` solves that
            linearised objective exactly, the M -> infinity limit of `drift`
            (`rofu.models.rofu_closed`: Woodbury on the data sample's Gram); `ntk-kfac` the
            same with Kronecker-factored curvature (`rofu.models.rofu_kfac`, MLPs only).
            Both ignore steps, step_size, step_decay, minibatch_size, baseline and
            stability_cap, and need l2 > 0 (the prior's precision).
        selection: how the UCBs become a choice (`rofu.models.selection`): `argmax` (ties
            uniform) or `igw` (inverse-gap weighting).
        exploration_floor: eps, the weight of a uniform choice mixed into the rule's, so
            every candidate keeps probability >= eps / K (0: none).
        igw_gamma: gamma of `igw`: an arm gap below the best UCB gets 1 / (K + gamma gap).
        stability_cap: None (the paper's fixed step) or the largest rho = kappa * L the
            ascent may run at, L the regulariser's curvature at the checkpoint
            (`rofu.models.rofu_stability`): the step is cut to cap / L where it exceeds it.
            Past rho = 2 the steps diverge; 1 keeps them monotone.
        closed_rows: m, the rows of the data sample `ntk-closed` estimates the curvature on
            (drawn once per checkpoint when the sample holds more; None: all of them). Its
            per-checkpoint cost grows as m^3 and its per-pair cost as m^2.
        kfac_rows: the rows of the data sample `ntk-kfac` estimates its factors on (drawn
            once per checkpoint when the sample holds more; None: all of them). Its
            per-checkpoint cost grows linearly in them; its per-pair cost does not.
        noise: sigma^2 of R read as a Gaussian log-likelihood, sum (f - r)^2 / (2 sigma^2)
            plus the prior l2 |theta|^2 (`rofu.models.scaling`): `fixed`, sigma^2 = 1/2 (R
            = w MSE, the paper's), or `prequential`, the served model's exponentially
            weighted squared residual on rows it had not been trained on
            (`RegulariserData.noise`), so the bonus scales with sigma. Every estimator
            applies it as eta -> eta / (2 sigma^2) and l2 -> 2 sigma^2 l2.

    Each field is declared once (`rofu.models.hyper`): its bounds, and its key in the
    replay's variant names (`ROFU@step=0.1`); the service's `ROFU_*` settings and the
    variant keys are derived from them.
    """

    steps: int = hyper(5, low=0)
    step_size: float = hyper(0.01, key="step", low=0.0, low_open=True)
    step_decay: float = hyper(1.0, low=0.0, high=1.0, low_open=True)
    eta: float = hyper(1.0, low=0.0, low_open=True)
    regulariser: str = hyper("dataset", key="reg", choices=REGULARISERS)
    l2: float = hyper(0.0, low=0.0)
    minibatch_size: int | None = hyper(256, key="mb", low=1)
    bonus_scale: float = hyper(1.0, key="scale", low=0.0)
    chunk_size: int | None = hyper(None, low=1)
    baseline: str = hyper("start", key="base", choices=BASELINES)
    estimator: str = hyper("exact", key="est", choices=ESTIMATORS)
    selection: str = hyper("argmax", key="select", choices=SELECTIONS)
    exploration_floor: float = hyper(0.0, key="floor", low=0.0, high=1.0)
    igw_gamma: float = hyper(100.0, key="gamma", low=0.0)
    stability_cap: float | None = hyper(None, key="cap", low=0.0, low_open=True)
    closed_rows: int | None = hyper(1024, key="rows", low=1)
    kfac_rows: int | None = hyper(4096, key="kfac-rows", low=1)
    noise: str = hyper("fixed", choices=NOISES)

    def __post_init__(self) -> None:
        check_hypers(self)
        if self.estimator in CLOSED_FORMS and not self.l2 > 0:
            raise ValueError(f"l2 must be > 0 for estimator {self.estimator!r}, got {self.l2}")

    @property
    def rule(self) -> SelectionRule:
        """The selection rule the UCBs are decided by (`rofu.models.selection`)."""
        return SelectionRule(self.selection, self.exploration_floor, self.igw_gamma)


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
