"""RewardNetConfig validation and JSON, RewardNet initialisation, shapes, arms and dropout."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rofu.models import RewardNet, RewardNetConfig
from rofu.models.networks import ACTIVATIONS
from tests.factories import arm_features, make_net


def _contexts(b: int, d: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- RewardNetConfig validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "form"),
    [
        ({"n_arms": 0, "arm_feature_dim": 0}, "neither"),
        ({"n_arms": 3, "arm_feature_dim": 2}, "both"),
    ],
)
def test_reward_net_config_requires_exactly_one_form(kwargs, form):
    with pytest.raises(ValueError, match="exactly one of n_arms") as info:
        RewardNetConfig(context_dim=4, **kwargs)
    assert "arm_feature_dim" in str(info.value), form


def test_reward_net_config_accepts_each_form():
    assert RewardNetConfig(context_dim=4, n_arms=3).per_arm_outputs
    assert not RewardNetConfig(context_dim=4, arm_feature_dim=2).per_arm_outputs


BAD_CONFIGS = [
    ({"context_dim": 0}, ValueError, "context_dim"),
    ({"context_dim": 2.0}, TypeError, "context_dim"),
    ({"n_arms": -1}, ValueError, "n_arms"),
    ({"n_arms": True}, TypeError, "n_arms"),
    ({"n_arms": 0, "arm_feature_dim": -2}, ValueError, "arm_feature_dim"),
    ({"hidden": [8, 8]}, TypeError, "hidden"),
    ({"hidden": (8, 0)}, ValueError, "hidden"),
    ({"hidden": (8, "8")}, TypeError, "hidden"),
    ({"hidden": (8.0,)}, TypeError, "hidden"),
    ({"activation": "swish"}, ValueError, "activation"),
    ({"activation": None}, ValueError, "activation"),
    ({"bias": 1}, TypeError, "bias"),
    ({"dropout": 1.0}, ValueError, "dropout"),
    ({"dropout": -0.1}, ValueError, "dropout"),
    ({"dropout": float("nan")}, ValueError, "dropout"),
    ({"dropout": "0.1"}, TypeError, "dropout"),
    ({"init_scale": -0.3}, ValueError, "init_scale"),
    ({"init_scale": float("inf")}, ValueError, "init_scale"),
    ({"seed": -1}, ValueError, "seed"),
    ({"seed": 1.5}, TypeError, "seed"),
    ({"seed": None}, TypeError, "seed"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), BAD_CONFIGS, ids=[f"{c[2]}={c[0]}" for c in BAD_CONFIGS]
)
def test_reward_net_config_rejects_bad_argument_naming_it(kwargs, error, name):
    with pytest.raises(error, match=name):
        RewardNetConfig(**{"context_dim": 4, "n_arms": 3, **kwargs})


def test_reward_net_config_is_frozen():
    config = RewardNetConfig(context_dim=4, n_arms=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_arms = 5  # type: ignore[misc]


# --- JSON -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        RewardNetConfig(context_dim=4, n_arms=3),
        RewardNetConfig(
            context_dim=7,
            arm_feature_dim=3,
            hidden=(5, 6, 7),
            activation="tanh",
            bias=False,
            dropout=0.25,
            init_scale=0.3,
            seed=11,
        ),
        RewardNetConfig(context_dim=2, n_arms=1, hidden=()),
    ],
    ids=["per-arm defaults", "arm-feature everything set", "linear"],
)
def test_reward_net_config_json_round_trip(config):
    text = config.to_json()
    back = RewardNetConfig.from_json(text)
    assert back == config
    assert isinstance(back.hidden, tuple)
    assert back.to_json() == text, "the JSON form is canonical"


def test_reward_net_config_from_json_refuses_unknown_fields():
    text = RewardNetConfig(context_dim=4, n_arms=3).to_json()[:-1] + ', "depth": 3}'
    with pytest.raises(ValueError, match="unknown fields.*depth"):
        RewardNetConfig.from_json(text)


@pytest.mark.parametrize("text", ["[1, 2]", '"config"', "3"])
def test_reward_net_config_from_json_refuses_a_non_object(text):
    with pytest.raises(ValueError, match="JSON object"):
        RewardNetConfig.from_json(text)


def test_reward_net_config_from_json_validates_values():
    text = RewardNetConfig(context_dim=4, n_arms=3).to_json().replace('"relu"', '"swish"')
    with pytest.raises(ValueError, match="activation"):
        RewardNetConfig.from_json(text)


# --- initialisation -------------------------------------------------------------------------


def _states_equal(a: RewardNet, b: RewardNet) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("init_scale", [0.0, 0.3])
@pytest.mark.parametrize("form", [{"n_arms": 3}, {"arm_feature_dim": 2}])
def test_reward_net_initialisation_is_deterministic_in_the_seed(init_scale, form):
    def build(seed: int) -> RewardNet:
        return RewardNet(
            RewardNetConfig(context_dim=5, hidden=(8, 8), init_scale=init_scale, seed=seed, **form)
        )

    torch.manual_seed(123)  # the global RNG must not matter
    first = build(4)
    torch.manual_seed(456)
    assert _states_equal(first, build(4))
    assert not _states_equal(first, build(5))


def test_reward_net_reset_parameters_restores_the_seeded_weights():
    net = make_net(seed=2, dtype=torch.float32)
    fresh = make_net(seed=2, dtype=torch.float32)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    assert not _states_equal(net, fresh)
    net.reset_parameters()
    assert _states_equal(net, fresh)


@pytest.mark.parametrize("scale", [0.05, 0.3, 2.0])
def test_reward_net_init_scale_bounds_every_parameter(scale):
    net = RewardNet(RewardNetConfig(context_dim=30, n_arms=20, hidden=(200,), init_scale=scale))
    for name, p in net.state_dict().items():
        assert float(p.abs().max()) <= scale, name
        # >= 20 uniform draws each: P(all below half the bound) <= 2**-20, so the extremes
        # reach towards the bound (PyTorch's default would sit at 1/sqrt(fan_in) instead).
        assert float(p.abs().max()) > 0.5 * scale, name


def test_reward_net_default_init_is_bounded_by_fan_in():
    net = RewardNet(RewardNetConfig(context_dim=25, n_arms=4, hidden=(100,)))
    state = net.state_dict()
    for i, layer in enumerate(net.layers):
        bound = 1.0 / layer.in_features**0.5
        assert float(state[f"layers.{i}.weight"].abs().max()) <= bound + 1e-7
        assert float(state[f"layers.{i}.bias"].abs().max()) <= bound + 1e-7


def test_reward_net_without_bias_has_no_bias_parameters():
    net = make_net(bias=False)
    assert all(layer.bias is None for layer in net.layers)
    assert all(name.endswith("weight") for name, _ in net.named_parameters())


# --- shapes and forms -----------------------------------------------------------------------


@pytest.mark.parametrize("hidden", [(), (7,), (5, 6, 4)])
def test_reward_net_per_arm_shapes(hidden):
    net = make_net(context_dim=6, n_arms=4, hidden=hidden)
    x = _contexts(5)
    arms = torch.tensor([0, 3, 1, 2, 3])
    assert net.forward(x, arms).shape == (5,)
    assert net.score_all(x).shape == (5, 4)
    assert net.hidden_features(x).shape == (5, hidden[-1] if hidden else 6)
    assert net.arm_count() == 4


@pytest.mark.parametrize("hidden", [(), (7,), (5, 6)])
def test_reward_net_arm_feature_shapes(hidden):
    net = make_net(context_dim=6, arm_feature_dim=3, hidden=hidden)
    features = arm_features(5, 3)
    x = _contexts(4)
    arms = torch.tensor([0, 4, 2, 2])
    assert net.inputs(x, arms, features).shape == (4, 9)
    assert net.forward(x, arms, features).shape == (4,)
    assert net.score_all(x, features).shape == (4, 5)
    assert net.arm_count(features) == 5


@pytest.mark.parametrize("form", [{}, {"arm_feature_dim": 3}], ids=["per-arm", "arm-feature"])
def test_reward_net_forward_equals_score_all_gathered(form):
    net = make_net(context_dim=6, n_arms=5, **form)
    features = arm_features(5, 3) if form else None
    x = _contexts(7, seed=1)
    arms = torch.tensor([4, 0, 1, 1, 3, 2, 4])
    every = net.score_all(x, features)  # (B, A)
    torch.testing.assert_close(
        net.forward(x, arms, features), every.gather(1, arms[:, None]).squeeze(1)
    )
    # and score_all is forward over every (context, arm) pair
    for a in range(5):
        column = net.forward(x, torch.full((7,), a), features)
        torch.testing.assert_close(column, every[:, a])


def test_reward_net_arm_feature_form_requires_arm_features():
    net = make_net(arm_feature_dim=3)
    x = _contexts(2)
    with pytest.raises(ValueError, match="arm_features"):
        net.forward(x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="arm_features"):
        net.score_all(x)
    with pytest.raises(ValueError, match="arm_features"):
        net.arm_count()


def test_reward_net_per_arm_form_ignores_arm_features_for_arm_count():
    assert make_net(n_arms=4).arm_count(arm_features(9, 3)) == 4


def test_reward_net_scores_a_new_arm_without_changing_parameters():
    net = make_net(arm_feature_dim=3)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    features = arm_features(4, 3, seed=1)
    x = _contexts(6, seed=2)
    old = net.score_all(x, features)
    grown = torch.cat([features, torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)])
    new = net.score_all(x, grown)
    assert new.shape == (6, 5)
    torch.testing.assert_close(new[:, :4], old)  # equal up to BLAS batch rounding
    assert bool(torch.isfinite(new[:, 4]).all())
    assert not torch.allclose(new[:, 4], new[:, 0]), "the new arm is scored from its features"
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_reward_net_works_in_float32_and_float64():
    for dtype in (torch.float32, torch.float64):
        net = make_net(dtype=dtype)
        assert net.score_all(_contexts(3).to(dtype)).dtype == dtype


# --- activations and dropout ----------------------------------------------------------------


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_reward_net_every_activation_scores(activation):
    net = make_net(activation=activation, hidden=(8,))
    x = _contexts(5)
    scores = net.score_all(x)
    assert scores.shape == (5, 4)
    assert bool(torch.isfinite(scores).all())
    # the activation is the one applied to the hidden layer
    want = ACTIVATIONS[activation](net.layers[0](x))
    torch.testing.assert_close(net.hidden_features(x), want)


def test_reward_net_activations_differ():
    x = _contexts(5)
    outputs = [make_net(activation=a, hidden=(8,)).score_all(x) for a in sorted(ACTIVATIONS)]
    for i, first in enumerate(outputs):
        for second in outputs[i + 1 :]:
            assert not torch.allclose(first, second)


def _dropout_net(dropout: float = 0.5) -> RewardNet:
    config = RewardNetConfig(context_dim=6, n_arms=4, hidden=(32, 32), dropout=dropout, seed=3)
    return RewardNet(config).double()


def test_reward_net_dropout_only_with_a_generator():
    net, plain = _dropout_net(0.5), _dropout_net(0.0)
    x = _contexts(8)
    torch.testing.assert_close(net.score_all(x), plain.score_all(x), rtol=0, atol=0)
    torch.testing.assert_close(net.score_all(x), net.score_all(x), rtol=0, atol=0)
    dropped = net.score_all(x, dropout_generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(dropped, net.score_all(x))


def test_reward_net_dropout_is_reproducible_by_generator_seed():
    net = _dropout_net()
    x = _contexts(8)
    arms = torch.arange(8) % 4

    def draw(seed: int) -> torch.Tensor:
        return net.forward(x, arms, dropout_generator=torch.Generator().manual_seed(seed))

    torch.testing.assert_close(draw(5), draw(5), rtol=0, atol=0)
    assert not torch.allclose(draw(5), draw(6))


def test_reward_net_dropout_zero_ignores_the_generator():
    net = _dropout_net(0.0)
    x = _contexts(4)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    torch.testing.assert_close(net.score_all(x, dropout_generator=generator), net.score_all(x))
    assert torch.equal(generator.get_state(), state), "no random numbers were drawn"


def test_reward_net_dropout_keeps_the_mean_activation():
    # Inverted dropout: E[mask / keep] = 1, so averaged hidden features match the plain ones.
    net = RewardNet(RewardNetConfig(context_dim=6, n_arms=1, hidden=(16,), dropout=0.3)).double()
    x = _contexts(1).expand(20_000, 6)
    generator = torch.Generator().manual_seed(1)
    mean = net.hidden_features(x, generator).mean(dim=0)
    plain = net.hidden_features(x[:1])[0]
    # Each unit: 20 000 draws of h * Bernoulli(0.7) / 0.7, std h * sqrt(0.3/0.7/20000) < 0.005 h.
    torch.testing.assert_close(mean, plain, rtol=0.03, atol=1e-12)
