"""A small convolutional reward network on image contexts (C, H, W), in both forms.

It proves that ROFU takes any `RewardModel`: its batch norm runs in eval mode during the
ascent, and the exact estimator reaches it through torch.func (`rofu.models.rofu_functional`),
the NTK estimator through explicit per-row gradients.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rofu.models.networks import ACTIVATIONS, RewardNet, RewardNetConfig
from rofu.models.reward_model import RewardModel
from rofu.models.validation import check_choice, check_int


@dataclass(frozen=True)
class ConvRewardNetConfig:
    """Constructor arguments of a `ConvRewardNet`.

    Conv layers of `channels` (kernel `kernel_size`, stride 1, "same" padding), each
    followed by batch norm (when `batch_norm`) and the activation; a global average pool;
    then a `RewardNet` head with hidden widths `hidden` on the pooled features, in the
    per-arm form (`n_arms >= 1`) or the arm-feature form (`arm_feature_dim >= 1`).
    Initialisation is deterministic in `seed`.
    """

    context_shape: tuple[int, int, int]
    n_arms: int = 0
    arm_feature_dim: int = 0
    channels: tuple[int, ...] = (8, 16)
    kernel_size: int = 3
    batch_norm: bool = True
    hidden: tuple[int, ...] = ()
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.context_shape, tuple) or len(self.context_shape) != 3:
            raise TypeError(f"context_shape must be a (C, H, W) tuple, got {self.context_shape!r}")
        for size in self.context_shape:
            check_int("context_shape", size, low=1)
        if not isinstance(self.channels, tuple) or not self.channels:
            raise TypeError(f"channels must be a non-empty tuple of ints, got {self.channels!r}")
        for width in self.channels:
            check_int("channels", width, low=1)
        check_int("kernel_size", self.kernel_size, low=1)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (same padding), got {self.kernel_size}")
        if not isinstance(self.batch_norm, bool):
            raise TypeError(f"batch_norm must be a bool, got {type(self.batch_norm).__name__}")
        check_choice("activation", self.activation, ACTIVATIONS)
        _ = self.head  # validates n_arms, arm_feature_dim, hidden and seed

    @property
    def head(self) -> RewardNetConfig:
        """The MLP head on the (channels[-1],) pooled features."""
        return RewardNetConfig(
            context_dim=self.channels[-1],
            n_arms=self.n_arms,
            hidden=self.hidden,
            activation=self.activation,
            arm_feature_dim=self.arm_feature_dim,
            seed=self.seed,
        )

    def build(self) -> ConvRewardNet:
        """A freshly initialised `ConvRewardNet` of this config."""
        return ConvRewardNet(self)


class ConvRewardNet(RewardModel):
    """Conv trunk -> global average pool -> `RewardNet` head: f_theta(x, a) on images."""

    def __init__(self, config: ConvRewardNetConfig) -> None:
        super().__init__(
            config.context_shape, n_arms=config.n_arms, arm_feature_dim=config.arm_feature_dim
        )
        self.config = config
        widths = [config.context_shape[0], *config.channels]
        pad, bias = config.kernel_size // 2, not config.batch_norm
        self.convs: list[nn.Conv2d] = nn.ModuleList(  # type: ignore[assignment]
            nn.Conv2d(w_in, w_out, config.kernel_size, padding=pad, bias=bias)
            for w_in, w_out in itertools.pairwise(widths)
        )
        norms = [nn.BatchNorm2d(width) for width in config.channels] if config.batch_norm else []
        self.norms: list[nn.BatchNorm2d] = nn.ModuleList(norms)  # type: ignore[assignment]
        self.head = RewardNet(config.head)
        self.activation = ACTIVATIONS[config.activation]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every parameter deterministically from `config.seed`."""
        generator = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for conv in self.convs:
                nn.init.kaiming_uniform_(conv.weight, a=math.sqrt(5), generator=generator)
                if conv.bias is not None:
                    bound = 1.0 / math.sqrt(conv.weight[0].numel())
                    nn.init.uniform_(conv.bias, -bound, bound, generator=generator)
        for norm in self.norms:
            norm.reset_parameters()  # weight 1, bias 0, running mean 0 and variance 1
        self.head.reset_parameters()

    def embed(self, x: Tensor) -> Tensor:
        """Pooled trunk features: (N, C, H, W) -> (N, channels[-1])."""
        h = x
        for index, conv in enumerate(self.convs):
            h = conv(h)  # (N, C_l, H, W)
            if self.norms:
                h = self.norms[index](h)
            h = self.activation(h)
        return h.mean(dim=(2, 3))

    def forward(self, x: Tensor, arms: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Predicted reward of each (image, arm) pair: (N, C, H, W), (N,) -> (N,)."""
        out: Tensor = self.head(self.embed(x), arms, arm_features)
        return out

    def score_all(self, x: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Every arm of every image, the trunk run once per image: (B, C, H, W) -> (B, A)."""
        return self.head.score_all(self.embed(x), arm_features)
