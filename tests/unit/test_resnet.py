"""The CIFAR ResNet reward model: 6n + 2 weighted layers, the paper's parameter counts,
seeded initialisation, both scoring paths, and ROFU's bonus on it growing with M."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from rofu.models import RofuConfig, Transitions, rofu_scores
from rofu.models.data import RegulariserData
from rofu.models.resnet import ResNet, ResNetConfig

SMALL = (3, 8, 8)  # images small enough for seconds-long tests


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny convolutions thrash with a second thread when another process holds a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _weighted_layers(net: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d | nn.Linear) for m in net.modules())


@pytest.mark.parametrize(("depth", "params"), [(20, 0.27e6), (32, 0.46e6)])
def test_resnet_has_6n_plus_2_layers_and_the_papers_size(depth: int, params: float) -> None:
    net = ResNetConfig(depth=depth, n_arms=10).build()
    assert _weighted_layers(net) == depth
    assert net.config.blocks == (depth - 2) // 6
    # He et al. 2016, Table 6: ResNet-20 0.27M, ResNet-32 0.46M parameters
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(params, rel=0.02)


def test_resnet_scores_every_arm_of_every_image() -> None:
    net = ResNetConfig(context_shape=(3, 32, 32), n_arms=7, depth=20, width=2).build().eval()
    x = torch.rand(5, 3, 32, 32)
    scores = net.score_all(x)
    assert scores.shape == (5, 7)
    arms = torch.tensor([0, 6, 3, 3, 1])
    torch.testing.assert_close(net(x, arms), scores[torch.arange(5), arms])
    features = net.blocks(torch.relu(net.bn(net.conv(x))))
    assert features.shape == (5, 8, 8, 8)  # 4 x width channels at a quarter of the side
    with pytest.raises(ValueError, match="arm_features must be None"):
        net.score_all(x, torch.zeros(7, 2))


def test_resnet_initialisation_is_deterministic_in_its_seed() -> None:
    def weights(seed: int) -> torch.Tensor:
        net = ResNetConfig(SMALL, 3, depth=8, width=2, seed=seed).build()
        return torch.cat([p.detach().flatten() for p in net.parameters()])

    torch.testing.assert_close(weights(4), weights(4))
    assert not torch.equal(weights(4), weights(5))


@pytest.mark.parametrize("depth", [7, 21, 2])
def test_resnet_config_refuses_a_depth_that_is_not_6n_plus_2(depth: int) -> None:
    with pytest.raises(ValueError, match="depth"):
        ResNetConfig(depth=depth)


def test_resnet_config_refuses_bad_shapes_and_widths() -> None:
    with pytest.raises(TypeError, match="context_shape"):
        ResNetConfig(context_shape=(32, 32))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="width"):
        ResNetConfig(width=0)


@pytest.mark.parametrize("estimator", ["exact", "ntk"])
def test_rofu_bonus_on_a_resnet_grows_with_the_ascent_steps(estimator: str) -> None:
    net = ResNetConfig(SMALL, 3, depth=8, width=2, seed=1).build().double().eval()
    assert isinstance(net, ResNet)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(24, *SMALL, generator=g, dtype=torch.float64)
    arms = torch.arange(24) % 3
    with torch.no_grad():
        rewards = net(x, arms) + 0.1 * torch.randn(24, generator=g, dtype=torch.float64)
    data = RegulariserData(
        Transitions(x, arms, rewards), n_total=24, arm_counts=torch.full((3,), 8)
    )
    contexts = torch.rand(1, *SMALL, generator=g, dtype=torch.float64)
    bonuses = []
    for steps in (1, 5, 10):
        config = RofuConfig(
            steps=steps, step_size=1e-3, minibatch_size=4, baseline="drift", estimator=estimator
        )
        scores = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(3))
        assert torch.isfinite(scores.bonus).all()
        bonuses.append(scores.bonus)
    assert (bonuses[0] > 0).all()
    assert (bonuses[1] > bonuses[0]).all()
    assert (bonuses[2] > bonuses[1]).all()
