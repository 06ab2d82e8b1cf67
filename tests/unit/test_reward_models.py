"""The reward-model contract: `RewardModel`'s two forms, `ConvRewardNet` and its config, the
plain-module adapters, mode switching, and image contexts in the data contracts and `fit`."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from rofu.models import (
    ConvRewardNetConfig,
    DataBuffer,
    FitConfig,
    PairModel,
    PerArmModel,
    RewardModel,
    RewardNetConfig,
    Transitions,
    fit,
)
from rofu.models.reward_model import evaluating, training
from tests.factories import IMAGE, arm_features, make_conv_net, make_transitions


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"context_shape": ()}, TypeError, "context_shape"),
        ({"context_shape": [3]}, TypeError, "context_shape"),
        ({"context_shape": (3, 0)}, ValueError, "context_shape"),
        ({"context_shape": (3,)}, ValueError, "exactly one of n_arms"),
        ({"context_shape": (3,), "n_arms": 2, "arm_feature_dim": 2}, ValueError, "exactly one"),
        ({"context_shape": (3,), "n_arms": -1}, ValueError, "n_arms"),
    ],
)
def test_reward_model_rejects_bad_shapes_and_forms(kwargs, error, name):
    with pytest.raises(error, match=name):
        RewardModel(**kwargs)


BAD_CONV_CONFIGS = [
    ({"context_shape": (3, 8)}, TypeError, "context_shape"),
    ({"context_shape": (3, 8, 0)}, ValueError, "context_shape"),
    ({"channels": ()}, TypeError, "channels"),
    ({"channels": (4, 0)}, ValueError, "channels"),
    ({"kernel_size": 2}, ValueError, "kernel_size"),
    ({"kernel_size": 0}, ValueError, "kernel_size"),
    ({"batch_norm": 1}, TypeError, "batch_norm"),
    ({"activation": "swish"}, ValueError, "activation"),
    ({"n_arms": 0}, ValueError, "exactly one of n_arms"),
    ({"hidden": [4]}, TypeError, "hidden"),
    ({"seed": -1}, ValueError, "seed"),
]


@pytest.mark.parametrize(("kwargs", "error", "name"), BAD_CONV_CONFIGS)
def test_conv_reward_net_config_rejects_bad_values_naming_them(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name} "):
        ConvRewardNetConfig(**{"context_shape": IMAGE, "n_arms": 4, **kwargs})


def test_conv_reward_net_initialisation_is_deterministic_in_its_seed():
    def weights(seed: int) -> Tensor:
        net = ConvRewardNetConfig(context_shape=IMAGE, n_arms=4, seed=seed).build()
        return torch.cat([p.detach().flatten() for p in net.parameters()])

    assert torch.equal(weights(3), weights(3))
    assert not torch.equal(weights(3), weights(4))


def _pair_scores(net: RewardModel, x: Tensor, features: Tensor | None) -> Tensor:
    """score_all's definition: forward over every (context, arm) pair."""
    n_arms = net.arm_count(features)
    arms = torch.arange(n_arms).repeat(len(x))
    with torch.no_grad():
        return net(x.repeat_interleave(n_arms, 0), arms, features).view(len(x), n_arms)


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(IMAGE[0] * IMAGE[1] * IMAGE[2], 5))
        self.out = nn.Bilinear(5, 3, 1)

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        out: Tensor = self.out(torch.tanh(self.trunk(x)), z)
        return out  # (N, 1)


MODELS = {
    "cnn per-arm": lambda: make_conv_net(4),
    "cnn arm features": lambda: make_conv_net(arm_feature_dim=3),
    "cnn without batch norm": lambda: make_conv_net(4, batch_norm=False),
    "per-arm module": lambda: PerArmModel(
        nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.LazyLinear(4)), IMAGE, 4
    ),
    "pair module": lambda: PairModel(_Pair(), IMAGE, 3),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reward_model_score_all_equals_forward_over_pairs(name):
    net = MODELS[name]().double().eval()
    features = None if net.per_arm_outputs else arm_features(4, 3)
    x = torch.randn(3, *IMAGE, generator=torch.Generator().manual_seed(0)).double()
    with torch.no_grad():
        scores = net.score_all(x, features)
    assert scores.shape == (3, 4)
    assert net.context_shape == IMAGE
    torch.testing.assert_close(scores, _pair_scores(net, x, features))


def test_adapters_check_the_arm_features_of_their_form():
    per_arm, pair = MODELS["per-arm module"]().double(), MODELS["pair module"]().double()
    x = torch.zeros(2, *IMAGE, dtype=torch.float64)
    with pytest.raises(ValueError, match="arm_features must be None"):
        per_arm.score_all(x, arm_features(4, 3))
    with pytest.raises(ValueError, match="arm_features is required"):
        pair.score_all(x)
    with pytest.raises(ValueError, match="arm_features is required"):
        pair.arm_count()


def _fail_while_training(net: nn.Module) -> None:
    with training(net):
        assert all(module.training for module in net.modules())
        raise RuntimeError("boom")


def test_evaluating_and_training_restore_every_submodules_mode_even_on_error():
    net = make_conv_net(4)
    net.train()
    net.norms[1].eval()
    with evaluating(net):
        assert not any(module.training for module in net.modules())
    assert net.training
    assert [norm.training for norm in net.norms] == [True, False]
    with pytest.raises(RuntimeError, match="boom"):
        _fail_while_training(net)
    assert [norm.training for norm in net.norms] == [True, False]


# --- image contexts in the data contracts and fit --------------------------------------------


def test_transitions_accept_image_contexts_and_refuse_a_1d_x():
    batch = make_transitions(6, IMAGE, 3)
    assert batch.x.shape == (6, *IMAGE)
    assert batch.subset(torch.tensor([0, 2])).x.shape == (2, *IMAGE)
    assert Transitions.concat([batch, batch]).x.shape == (12, *IMAGE)
    with pytest.raises(ValueError, match=r"^x must have shape \(N, \*context_shape\)"):
        Transitions(torch.zeros(6), batch.arms, batch.rewards)


def test_data_buffer_holds_image_contexts_in_its_reservoir():
    generator = torch.Generator().manual_seed(0)
    buffer = DataBuffer(IMAGE, max_size=5, dtype=torch.float64, generator=generator)
    batch = make_transitions(12, IMAGE, 3)
    buffer.append(batch)
    view = buffer.view()
    assert view.x.shape == (5, *IMAGE)
    assert buffer.n_total == 12
    rows = [int((batch.x == row).all(dim=(1, 2, 3)).nonzero()) for row in view.x]
    assert torch.equal(view.arms, batch.arms[rows]), "each row kept whole"
    restored = DataBuffer.restore(buffer.regulariser_data(3), max_size=5)
    assert restored.context_shape == IMAGE
    assert torch.equal(restored.view().x, view.x)
    with pytest.raises(ValueError, match=r"^batch\.x must have shape \(3, 6, 6\)"):
        buffer.append(make_transitions(2, (3, 5, 5), 3))
    with pytest.raises(ValueError, match="batch.x must have 4 features, got 3"):
        DataBuffer(4).append(make_transitions(2, 3, 3))


def test_data_buffer_rejects_a_bad_context_shape_naming_it():
    with pytest.raises(ValueError, match="context_dim"):
        DataBuffer((3, 0, 4))
    with pytest.raises(TypeError, match="context_dim"):
        DataBuffer(())


def test_fit_trains_a_cnn_in_train_mode_and_restores_eval_mode():
    net = make_conv_net(3).float().eval()
    data = make_transitions(40, IMAGE, 3, dtype=torch.float32)
    stats = net.norms[0].running_mean.clone()
    config = FitConfig(steps=30, batch_size=20, lr=0.01)
    metrics = fit(net, data, config, torch.Generator().manual_seed(0))
    assert not net.training
    assert not torch.equal(net.norms[0].running_mean, stats), "batch statistics were used"
    assert metrics["loss"] < metrics["loss_first"]


def test_fit_refuses_contexts_of_another_shape_and_dropout_on_a_cnn():
    net = make_conv_net(3)
    with pytest.raises(ValueError, match=r"data\.x must have shape \(3, 6, 6\)"):
        fit(net, make_transitions(8, (3, 4, 4), 3), FitConfig(), torch.Generator())
    with pytest.raises(TypeError, match="dropout_generator needs a RewardNet"):
        fit(
            net,
            make_transitions(8, IMAGE, 3),
            FitConfig(),
            torch.Generator(),
            dropout_generator=torch.Generator(),
        )


def test_reward_net_config_builds_the_mlp():
    config = RewardNetConfig(context_dim=5, n_arms=3, hidden=(4,), seed=2)
    net = config.build()
    assert net.config == config
    assert (net.context_shape, net.n_arms, net.arm_feature_dim) == ((5,), 3, 0)
