"""Small, seeded builders of networks, data and problems shared by the tests."""

from __future__ import annotations

import torch

from rofu.models import (
    Checkpoint,
    ConvRewardNet,
    ConvRewardNetConfig,
    RegulariserData,
    RewardNet,
    RewardNetConfig,
    Transitions,
    dump_checkpoint,
)

IMAGE = (3, 6, 6)  # (C, H, W) image contexts of the CNN tests


def make_net(
    context_dim: int = 6,
    n_arms: int = 4,
    hidden: tuple[int, ...] = (16, 16),
    *,
    arm_feature_dim: int = 0,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    bias: bool = True,
    activation: str = "relu",
) -> RewardNet:
    """A RewardNet in the per-arm form (or arm-feature form when arm_feature_dim > 0)."""
    config = RewardNetConfig(
        context_dim=context_dim,
        n_arms=0 if arm_feature_dim else n_arms,
        hidden=hidden,
        arm_feature_dim=arm_feature_dim,
        bias=bias,
        activation=activation,
        seed=seed,
    )
    return RewardNet(config).to(dtype)


def make_conv_net(
    n_arms: int = 4,
    *,
    arm_feature_dim: int = 0,
    shape: tuple[int, int, int] = IMAGE,
    channels: tuple[int, ...] = (4, 5),
    hidden: tuple[int, ...] = (6,),
    batch_norm: bool = True,
    activation: str = "relu",
    seed: int = 0,
) -> ConvRewardNet:
    """A small float64 ConvRewardNet; its batch norm gets non-trivial running statistics
    and affine parameters, so that eval mode differs from an identity."""
    config = ConvRewardNetConfig(
        context_shape=shape,
        n_arms=0 if arm_feature_dim else n_arms,
        arm_feature_dim=arm_feature_dim,
        channels=channels,
        hidden=hidden,
        batch_norm=batch_norm,
        activation=activation,
        seed=seed,
    )
    net = config.build().double()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for norm in net.norms:
            norm.running_mean.uniform_(-0.5, 0.5, generator=gen)
            norm.running_var.uniform_(0.5, 2.0, generator=gen)
            norm.weight.uniform_(0.5, 1.5, generator=gen)
            norm.bias.uniform_(-0.2, 0.2, generator=gen)
    return net


def make_transitions(
    n: int,
    context_dim: int | tuple[int, ...],
    n_arms: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> Transitions:
    """n random transitions with every arm present (when n >= n_arms); a tuple
    `context_dim` is the shape of one context (an image)."""
    gen = torch.Generator().manual_seed(seed)
    shape = context_dim if isinstance(context_dim, tuple) else (context_dim,)
    x = torch.randn(n, *shape, generator=gen, dtype=dtype)
    arms = torch.arange(n) % n_arms
    arms = arms[torch.randperm(n, generator=gen)]
    rewards = torch.randn(n, generator=gen, dtype=dtype)
    return Transitions(x, arms, rewards)


def make_data(
    n: int,
    context_dim: int | tuple[int, ...],
    n_arms: int,
    *,
    n_total: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> RegulariserData:
    """Regulariser data: a sample of n rows standing for n_total (default n) pulls."""
    sample = make_transitions(n, context_dim, n_arms, seed=seed, dtype=dtype)
    counts = torch.bincount(sample.arms, minlength=n_arms)
    extra = (n_total or n) - n
    if extra:
        gen = torch.Generator().manual_seed(seed + 1)
        counts = counts + torch.bincount(
            torch.randint(n_arms, (extra,), generator=gen), minlength=n_arms
        )
    return RegulariserData(sample, n_total or n, counts)


def arm_features(n_arms: int, feature_dim: int, *, seed: int = 0) -> torch.Tensor:
    """(A, F) random arm features in float64."""
    return torch.randn(n_arms, feature_dim, generator=torch.Generator().manual_seed(seed)).double()


def linear_problem(
    n: int, context_dim: int, n_arms: int, *, seed: int = 0
) -> tuple[torch.Tensor, Transitions]:
    """A linear-Gaussian bandit: true weights (A, D) and n noisy uniformly logged pulls."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(n_arms, context_dim, generator=gen, dtype=torch.float64)
    x = torch.randn(n, context_dim, generator=gen, dtype=torch.float64)
    arms = torch.randint(n_arms, (n,), generator=gen)
    noise = 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    rewards = (x * weights[arms]).sum(dim=1) + noise
    return weights, Transitions(x, arms, rewards)


def decision_row(
    event_id: str,
    context: list[float],
    *,
    arm: str = "arm-0",
    slot: int = 0,
    candidates: list[str] | None = None,
    propensity: float = 1.0,
    model_version: int = 0,
):
    """A logged decision as the service would store it (for repository-level tests)."""
    from rofu.service.db.tables import DecisionRow

    return DecisionRow(
        event_id=event_id,
        context=context,
        candidates=candidates or [arm],
        arm_id=arm,
        slot=slot,
        propensity=propensity,
        model_version=model_version,
        explore=True,
        policy="cold-start" if model_version == 0 else "rofu",
        scores=[
            {"arm": candidate, "mean": None, "bonus": None, "ucb": None}
            for candidate in candidates or [arm]
        ],
        request_hash="x",
    )


def checkpoint_blob(version: int) -> bytes:
    """A small valid checkpoint blob (3 features, 2 arms) whose sample depends on `version`."""
    net = make_net(3, 2, hidden=(4,))
    sample = make_transitions(6, 3, 2, seed=version)
    data = RegulariserData(sample, 6, sample.arms.bincount(minlength=2))
    return dump_checkpoint(Checkpoint(version, net.config, net.state_dict(), data))
