"""The CIFAR ResNet of He et al. 2016 (section 4.2) as a reward model with one output per arm.

6n + 2 weighted layers: a 3x3 convolution, three stages of n basic blocks (two 3x3
convolutions each) at `width`, 2 `width` and 4 `width` channels, the second and third
stage halving the resolution in their first block, then global average pooling and a
linear layer with one output per arm. ResNet-20 is n = 3, ResNet-32 n = 5. Every
convolution is followed by batch norm; shortcuts are the paper's option A (identity, with
stride-2 subsampling and zero-padded channels where the shape changes: no parameters).
`width = 16` is the paper's network; a smaller width gives a CPU-sized one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from rofu.models.reward_model import RewardModel
from rofu.models.validation import check_int


@dataclass(frozen=True)
class ResNetConfig:
    """Constructor arguments of a `ResNet`.

    Attributes:
        context_shape: (C, H, W) of one image context.
        n_arms: outputs, one per arm.
        depth: weighted layers, 6n + 2 (20: ResNet-20, 32: ResNet-32).
        width: channels of the first stage (the paper's 16); the others have 2x and 4x.
        seed: initialisation is deterministic in it.
    """

    context_shape: tuple[int, int, int] = (3, 32, 32)
    n_arms: int = 10
    depth: int = 20
    width: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.context_shape, tuple) or len(self.context_shape) != 3:
            raise TypeError(f"context_shape must be a (C, H, W) tuple, got {self.context_shape!r}")
        for size in self.context_shape:
            check_int("context_shape", size, low=1)
        check_int("n_arms", self.n_arms, low=1)
        check_int("depth", self.depth, low=8)
        if self.depth % 6 != 2:
            raise ValueError(f"depth must be 6n + 2 (20, 32, 44, ...), got {self.depth}")
        check_int("width", self.width, low=1)
        check_int("seed", self.seed, low=0)

    @property
    def blocks(self) -> int:
        """n, the basic blocks per stage."""
        return (self.depth - 2) // 6

    def build(self) -> ResNet:
        """A freshly initialised `ResNet` of this config."""
        return ResNet(self)


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn plus the option-A shortcut, then relu."""

    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.stride, self.extra = stride, channels_out - channels_in

    def shortcut(self, x: Tensor) -> Tensor:
        """Identity; subsampled and zero-padded in channels where the shape changes."""
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            low = self.extra // 2
            x = F.pad(x, (0, 0, 0, 0, low, self.extra - low))
        return x

    def forward(self, x: Tensor) -> Tensor:
        """(N, C_in, H, W) -> (N, C_out, H / stride, W / stride)."""
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return torch.relu(h + self.shortcut(x))


class ResNet(RewardModel):
    """f_theta(x, a) = the a-th output of a CIFAR ResNet on image x (per-arm form)."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__(config.context_shape, n_arms=config.n_arms)
        self.config = config
        width = config.width
        self.conv = nn.Conv2d(config.context_shape[0], width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, channels = [], width
        for stage, out in enumerate((width, 2 * width, 4 * width)):
            for index in range(config.blocks):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(channels, out, stride))
                channels = out
        self.blocks = nn.Sequential(*blocks)
        self.linear = nn.Linear(channels, config.n_arms)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal weights (as the paper), PyTorch's uniform linear bias, batch norm at
        weight 1, bias 0, running mean 0 and variance 1; deterministic in `config.seed`."""
        generator = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Conv2d | nn.Linear):
                    nn.init.kaiming_normal_(module.weight, generator=generator)
                if isinstance(module, nn.BatchNorm2d):
                    module.reset_parameters()
            bound = 1.0 / math.sqrt(self.linear.in_features)
            nn.init.uniform_(self.linear.bias, -bound, bound, generator=generator)

    def score_all(self, x: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Every arm of every image: (B, C, H, W) -> (B, A)."""
        if arm_features is not None:
            raise ValueError("arm_features must be None for a network with one output per arm")
        h = torch.relu(self.bn(self.conv(x)))  # (B, width, H, W)
        h = self.blocks(h)  # (B, 4 width, H / 4, W / 4)
        out: Tensor = self.linear(h.mean(dim=(2, 3)))
        return out  # (B, A)

    def forward(self, x: Tensor, arms: Tensor, arm_features: Tensor | None = None) -> Tensor:
        """Predicted reward of each (image, arm) pair: (N, C, H, W), (N,) -> (N,)."""
        return self.score_all(x, arm_features).gather(1, arms[:, None])[:, 0]
