"""The reward-model contract: what ROFU, `fit` and the neural policies need from a network.

A reward model is an `nn.Module` subclassing `RewardModel`, in one of two forms:

- one output per arm: `n_arms >= 1`, `arm_feature_dim == 0` (a fixed arm set);
- f(x, z_a) over arm features: `arm_feature_dim >= 1`, `n_arms == 0` (arms can be added).

Contexts are tensors of any fixed shape, `(B, *context_shape)`: feature vectors (D,) for
the MLP `RewardNet`, images (C, H, W) for `ConvRewardNet` or a ResNet. A model provides

    forward(x, arms, arm_features=None) -> (N,)   f(x_n, arms_n) of N (context, arm) pairs
    score_all(x, arm_features=None) -> (B, A)     every arm of every context
    arm_count(arm_features=None) -> A

and its `forward` must treat rows independently, so that torch.func can take per-pair
gradients: batch statistics are used only inside `fit` (train mode); every other call,
ROFU's ascent included, runs in eval mode (`evaluating`), where batch norm reads its
running statistics. ROFU ascends the parameters only; buffers are read, never written.

A plain module becomes a reward model through `PerArmModel` (it maps (B, *shape) to
(B, A)) or `PairModel` (it maps (N, *shape) contexts and (N, F) arm features to (N,)).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import Tensor, nn

from rofu.models.validation import check_int


class RewardModel(nn.Module):
    """Base of every reward model f_theta(x, a) (see the module docstring).

    Args:
        context_shape: the shape of one context, e.g. (D,) or (C, H, W).
        n_arms: outputs of the per-arm form (0 for the arm-feature form).
        arm_feature_dim: F of the arm-feature form (0 for the per-arm form).

    Raises:
        ValueError, TypeError: a bad shape, or not exactly one form.
    """

    def __init__(
        self, context_shape: tuple[int, ...], *, n_arms: int = 0, arm_feature_dim: int = 0
    ) -> None:
        super().__init__()
        if not isinstance(context_shape, tuple) or not context_shape:
            raise TypeError(f"context_shape must be a non-empty tuple, got {context_shape!r}")
        for size in context_shape:
            check_int("context_shape", size, low=1)
        check_int("n_arms", n_arms, low=0)
        check_int("arm_feature_dim", arm_feature_dim, low=0)
        if (n_arms >= 1) == (arm_feature_dim >= 1):
            raise ValueError(
                "exactly one of n_arms (one output per arm) and arm_feature_dim "
                f"(f(x, z_a)) must be positive, got n_arms={n_arms}, "
                f"arm_feature_dim={arm_feature_dim}"
            )
        self.context_shape = context_shape
        self.n_arms = n_arms
        self.arm_feature_dim = arm_feature_dim

    @property
    def per_arm_outputs(self) -> bool:
        """True for the one-output-per-arm form."""
        return self.n_arms >= 1

    def forward(self, x: Tensor, arms: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Predicted reward of each (context, arm) pair: (N, *shape), (N,) -> (N,)."""
        raise NotImplementedError

    def score_all(self, x: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Predicted reward of every arm for every context: (B, *shape) -> (B, A).

        This default scores the B * A pairs through `forward`; a model that computes all
        arms at once (one output per arm, a shared trunk) overrides it.
        """
        batch, n_arms = x.shape[0], self.arm_count(arm_features)
        arms = torch.arange(n_arms, device=x.device).repeat(batch)  # (B*A,)
        pairs = x.repeat_interleave(n_arms, dim=0)  # (B*A, *shape)
        out: Tensor = self(pairs, arms, arm_features)
        return out.view(batch, n_arms)

    def arm_count(self, arm_features: Tensor | None = None) -> int:
        """Number of arms this model can score (outputs, or rows of `arm_features`)."""
        if self.per_arm_outputs:
            return self.n_arms
        return int(self.require_arm_features(arm_features).shape[0])

    def require_arm_features(self, arm_features: Tensor | None) -> Tensor:
        """The (A, F) arm features an arm-feature model needs; ValueError when missing."""
        if arm_features is None:
            raise ValueError("arm_features is required by an arm-feature network")
        return arm_features


class RewardModelConfig(Protocol):
    """Frozen constructor arguments that build a reward model (`RewardNetConfig`,
    `ConvRewardNetConfig`); a neural policy takes one and builds its network from it."""

    def build(self) -> RewardModel:
        """A freshly initialised model (deterministic in the config's seed)."""
        ...


class PerArmModel(RewardModel):
    """A plain module with one output per arm, (B, *context_shape) -> (B, A), as a reward
    model (e.g. a ResNet classifier whose A logits are the arms' rewards)."""

    def __init__(self, body: nn.Module, context_shape: tuple[int, ...], n_arms: int) -> None:
        super().__init__(context_shape, n_arms=check_int("n_arms", n_arms, low=1))
        self.body = body

    def score_all(self, x: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """(B, *shape) -> (B, A): the body's outputs."""
        if arm_features is not None:
            raise ValueError("arm_features must be None for a network with one output per arm")
        out: Tensor = self.body(x)
        return out  # (B, A)

    def forward(self, x: Tensor, arms: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """(N, *shape), (N,) -> (N,): each row's output at its arm."""
        return self.score_all(x, arm_features).gather(1, arms[:, None])[:, 0]


class PairModel(RewardModel):
    """A plain module f(x, z), (N, *context_shape) contexts and (N, F) arm features ->
    (N,) or (N, 1) rewards, as an arm-feature reward model."""

    def __init__(
        self, body: nn.Module, context_shape: tuple[int, ...], arm_feature_dim: int
    ) -> None:
        dim = check_int("arm_feature_dim", arm_feature_dim, low=1)
        super().__init__(context_shape, arm_feature_dim=dim)
        self.body = body

    def forward(self, x: Tensor, arms: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """(N, *shape), (N,) -> (N,): f(x_n, z_{arms_n})."""
        out: Tensor = self.body(x, self.require_arm_features(arm_features)[arms])  # (N,) or (N, 1)
        return out.reshape(x.shape[0])


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Run the block with `model` in eval mode, then restore every submodule's own mode."""
    with _mode(model, training=False):
        yield


@contextmanager
def training(model: nn.Module) -> Iterator[None]:
    """Run the block with `model` in train mode, then restore every submodule's own mode."""
    with _mode(model, training=True):
        yield


@contextmanager
def _mode(model: nn.Module, *, training: bool) -> Iterator[None]:
    modes = [(module, module.training) for module in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode
