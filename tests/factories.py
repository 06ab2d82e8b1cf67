"""Small, seeded builders of networks, data and problems shared by the tests."""

from __future__ import annotations

import torch

from models import RegulariserData, RewardNet, RewardNetConfig, Transitions


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


def make_transitions(
    n: int, context_dim: int, n_arms: int, *, seed: int = 0, dtype: torch.dtype = torch.float64
) -> Transitions:
    """n random transitions with every arm present (when n >= n_arms)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, context_dim, generator=gen, dtype=dtype)
    arms = torch.arange(n) % n_arms
    arms = arms[torch.randperm(n, generator=gen)]
    rewards = torch.randn(n, generator=gen, dtype=dtype)
    return Transitions(x, arms, rewards)


def make_data(
    n: int,
    context_dim: int,
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
    from service.db.tables import DecisionRow

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
