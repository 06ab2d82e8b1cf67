"""Fitting theta_t from theta_{t-1} on logged data: minibatch SGD, Adam or RMSprop."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from rofu.models.data import Transitions, feature_rows
from rofu.models.hyper import check_hypers, hyper
from rofu.models.networks import RewardNet, RewardNetConfig
from rofu.models.reward_model import RewardModel, RewardModelConfig, training
from rofu.models.validation import describe_contexts

OPTIMIZERS = ("sgd", "adam", "rmsprop")
SCHEDULES = ("constant", "inverse_time", "cosine")


@dataclass(frozen=True)
class FitConfig:
    """How one `fit` call trains.

    Attributes:
        steps: minibatch updates per call.
        batch_size: rows per minibatch (sampled with replacement; the whole data when
            smaller).
        optimizer: `sgd`, `adam` or `rmsprop` (with TensorFlow 1's decay 0.9 and epsilon
            1e-10); a fresh optimizer every call unless the caller hands `fit` one to continue.
        lr: initial learning rate.
        lr_schedule: `constant`; `inverse_time`, lr / (1 + lr_decay * k) at step k (the
            Showdown's decay, restarted every call); or `cosine` down to 0 over `steps`.
        lr_decay: rate of the inverse-time schedule.
        momentum: SGD momentum.
        weight_decay: L2 penalty coefficient handed to the optimizer.
        max_grad_norm: clip the global gradient norm (None: no clipping).
        standardise: the learner standardises contexts and rewards with running
            statistics (`RewardNetConfig.standardise`; a preset builds its network so):
            the network learns (r - mu_r) / s_r from (x - mu_x) / s_x, and its
            predictions and gradients are mapped back to the reward's scale.
        prequential_decay: d of the exponentially weighted prequential squared loss
            (`rofu.models.data.Prequential`) the learner keeps over new rows, each
            scored before the refit that trains on it: sigma^2 for
            `RofuConfig(noise="prequential")`, and what a learner family is chosen by.
    """

    steps: int = hyper(100, key="fit_steps", low=0)
    batch_size: int = hyper(512, key="fit_batch", low=1)
    optimizer: str = hyper("adam", key="fit_opt", choices=OPTIMIZERS)
    lr: float = hyper(1e-3, key="fit_lr", low=0.0, low_open=True)
    lr_schedule: str = hyper("constant", key="fit_sched", choices=SCHEDULES)
    lr_decay: float = hyper(0.0, key="fit_decay", low=0.0)
    momentum: float = hyper(0.0, key="fit_momentum", low=0.0, high=1.0)
    weight_decay: float = hyper(0.0, key="wd", low=0.0)
    max_grad_norm: float | None = hyper(None, key="clip", low=0.0, low_open=True)
    standardise: bool = hyper(False, key="std")
    prequential_decay: float = hyper(0.999, key="preq", low=0.0, high=1.0, low_open=True)

    def __post_init__(self) -> None:
        check_hypers(self)

    def lr_at(self, step: int) -> float:
        """Learning rate of update `step` (0-based)."""
        if self.lr_schedule == "inverse_time":
            return self.lr / (1.0 + self.lr_decay * step)
        if self.lr_schedule == "cosine":
            return 0.5 * self.lr * (1.0 + math.cos(math.pi * step / max(self.steps, 1)))
        return self.lr


def fit(
    net: RewardModel,
    data: Transitions,
    config: FitConfig,
    generator: torch.Generator,
    *,
    arm_features: Tensor | None = None,
    dropout_generator: torch.Generator | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, float]:
    """Train `net` in place on `data` by minibatch MSE, starting from its current weights.

    The network trains in train mode (batch norm on batch statistics, updating its running
    ones); its own mode is restored afterwards.

    Args:
        net: the reward model holding theta_{t-1}; it holds theta_t afterwards.
        data: logged transitions (N >= 1).
        config: optimiser, schedule and number of updates.
        generator: draws the minibatch rows; the same seed gives the same theta_t.
        arm_features: (A, F) arm features for an arm-feature network (rows carrying their
            own, `data.features`, read those instead).
        dropout_generator: train with dropout masks from this generator (Dropout policy;
            a `RewardNet` only).
        optimizer: continue this optimizer (from `make_optimizer(net, config)`), so its
            moment estimates carry over from earlier calls; None: a fresh one. The
            learning-rate schedule restarts every call either way.

    Returns:
        Metrics: `loss` (mean over the last tenth of updates), `loss_first`, `steps`,
        `rows`, `grad_norm` (last, before clipping) and `lr` (last).
    """
    _check_fit_inputs(net, config, data, arm_features, dropout_generator)
    device = next(net.parameters()).device
    if optimizer is None:
        optimizer = make_optimizer(net, config)
    elif {id(p) for g in optimizer.param_groups for p in g["params"]} != {
        id(p) for p in net.parameters()
    }:
        raise ValueError("optimizer must hold exactly the parameters of net")
    data = data.to(device, next(net.parameters()).dtype)
    if arm_features is not None:
        arm_features = arm_features.to(data.x)
    index, table = feature_rows(data.arms, data.features, arm_features)
    scale = _reward_scale(net).to(data.rewards)
    losses: list[Tensor] = []
    grad_norm = 0.0
    with training(net):
        for step in range(config.steps):
            rows = _rows(len(data), config.batch_size, generator).to(device)
            for group in optimizer.param_groups:
                group["lr"] = config.lr_at(step)
            args = (data.x[rows], index[rows], table)
            pred = net(*args) if dropout_generator is None else net(*args, dropout_generator)
            loss = ((pred - data.rewards[rows]) / scale).square().mean()  # in g's units
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.max_grad_norm is not None or step == config.steps - 1:
                grad_norm = _clip(net, config.max_grad_norm)  # the metric is the last step's
            optimizer.step()
            losses.append(loss.detach())
    tail = [float(v) for v in losses[-max(1, len(losses) // 10) :]] or [float("nan")]
    return {
        "loss": sum(tail) / len(tail),
        "loss_first": float(losses[0]) if losses else float("nan"),
        "steps": float(config.steps),
        "rows": float(len(data)),
        "grad_norm": grad_norm,
        "lr": config.lr_at(max(config.steps - 1, 0)),
    }


def _check_fit_inputs(
    net: RewardModel,
    config: FitConfig,
    data: Transitions,
    arm_features: Tensor | None,
    dropout_generator: torch.Generator | None,
) -> None:
    if not isinstance(data, Transitions) or len(data) == 0:
        raise ValueError("data must be a non-empty Transitions")
    if tuple(data.x.shape[1:]) != net.context_shape:
        raise ValueError(f"data.x must have {describe_contexts(net.context_shape)}")
    if data.features is not None and data.features.shape[1] != net.arm_feature_dim:
        raise ValueError(
            f"data.features must have {net.arm_feature_dim} columns (per-row arm features "
            "need an arm-feature network)"
        )
    if data.features is None and int(data.arms.max()) >= net.arm_count(arm_features):
        raise ValueError("data.arms refers to an arm the network cannot score")
    if config.standardise and not (isinstance(net, RewardNet) and net.config.standardise):
        raise ValueError(
            "FitConfig.standardise needs a network built with RewardNetConfig(standardise=True)"
        )
    if dropout_generator is not None and not isinstance(net, RewardNet):
        raise TypeError(f"dropout_generator needs a RewardNet, got {type(net).__name__}")


def _reward_scale(net: RewardModel) -> Tensor:
    """s_r of a standardising `RewardNet` (its loss is in g's units), else 1."""
    if isinstance(net, RewardNet):
        return net.reward_moments()[1].detach()
    return torch.ones(())


def learner_net_config(config: RewardModelConfig, fit: FitConfig) -> RewardModelConfig:
    """`config`, standardising when `fit.standardise` asks for it (an MLP only)."""
    if not fit.standardise:
        return config
    if not isinstance(config, RewardNetConfig):
        raise TypeError(
            f"FitConfig.standardise needs a RewardNetConfig (an MLP), got {type(config).__name__}"
        )
    return dataclasses.replace(config, standardise=True)


def _rows(n_rows: int, batch_size: int, generator: torch.Generator) -> Tensor:
    if batch_size >= n_rows:
        return torch.randperm(n_rows, generator=generator)
    return torch.randint(n_rows, (batch_size,), generator=generator)


def make_optimizer(net: nn.Module, config: FitConfig) -> torch.optim.Optimizer:
    """The optimizer `config` names, over `net`'s parameters, with no state yet.

    Each uses its multi-tensor (`foreach`) implementation: the same arithmetic as the
    per-parameter loop (bit for bit), with fewer kernel calls per step.
    """
    params = list(net.parameters())
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            foreach=True,
        )
    if config.optimizer == "rmsprop":
        # TensorFlow 1's RMSPropOptimizer defaults (decay 0.9, epsilon 1e-10), which the
        # Showdown's baselines were tuned with; PyTorch's alpha = 0.99 trains them worse.
        return torch.optim.RMSprop(
            params,
            lr=config.lr,
            alpha=0.9,
            eps=1e-10,
            weight_decay=config.weight_decay,
            foreach=True,
        )
    return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay, foreach=True)


def _clip(net: nn.Module, max_norm: float | None) -> float:
    if max_norm is None:
        norms = [p.grad.norm() for p in net.parameters() if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0
    return float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm))


#: The Deep Bayesian Bandits Showdown's `hparams_rms`: RMSprop, lr 0.1 with inverse-time
#: decay 0.5 restarted every training call, global-norm clipping at 5, 100 minibatches of
#: 512 every 50 rounds.
SHOWDOWN_FIT = FitConfig(
    steps=100,
    batch_size=512,
    optimizer="rmsprop",
    lr=0.1,
    lr_schedule="inverse_time",
    lr_decay=0.5,
    max_grad_norm=5.0,
)


@dataclass(frozen=True)
class TrainSchedule:
    """When a neural policy refits its network on all data seen so far.

    Attributes:
        every: refit after every `every` new transitions.
        dense_until: refit after every transition while fewer rows than this are held
            (NeuralUCB's official code trains every round for the first 2000).
        fit: how each refit trains (continuing from the current weights).
        persist: keep each network's optimizer across refits, so Adam's or RMSprop's
            moment estimates carry over (the learning-rate schedule still restarts);
            False: a fresh optimizer every refit.
        family: refit a family of candidate learners on the same rows and serve the one
            with the lowest prequential loss (`rofu.models.learners`; ROFU only).
        window: train on the last `window` rows only, for rewards that drift: an older
            row leaves the data, the regulariser's counts included (`DataBuffer`); 0:
            every row.
    """

    every: int = hyper(50, low=1)
    dense_until: int = hyper(0, low=0)
    fit: FitConfig = field(default_factory=lambda: SHOWDOWN_FIT)
    persist: bool = hyper(False)
    family: bool = hyper(False)
    window: int = hyper(0, low=0)

    def __post_init__(self) -> None:
        check_hypers(self)
        if not isinstance(self.fit, FitConfig):
            raise TypeError(f"fit must be a FitConfig, got {type(self.fit).__name__}")

    def due(self, before: int, after: int) -> bool:
        """Whether growing the data from `before` to `after` rows triggers a refit."""
        if after > before and before < self.dense_until:
            return True
        return after // self.every > before // self.every
