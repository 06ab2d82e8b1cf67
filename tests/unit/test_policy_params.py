"""The neural policies' hyper-parameters: frozen dataclasses, the documented defaults, and
the one constructor refusing params (and schedules) of the wrong type. Bad values are
refused with messages naming them (`test_policies.py`, BAD_HYPERPARAMETERS)."""

from __future__ import annotations

import dataclasses

import pytest

from rofu.models import FitConfig, RewardNetConfig, RofuConfig
from rofu.models.policies import (
    NEURALUCB_SCHEDULE,
    Bootstrap,
    BootstrapParams,
    Dropout,
    DropoutParams,
    EpsilonGreedy,
    EpsilonGreedyParams,
    Greedy,
    NeuralLinear,
    NeuralLinearParams,
    NeuralPolicy,
    NeuralUCB,
    NeuralUCBParams,
    ParamNoise,
    ParamNoiseParams,
    RofuPolicy,
    TrainSchedule,
)
from rofu.models.presets import PRODUCT
from rofu.replay.simulation.policies import configuration
from tests.factories import linear_problem

D, A = 5, 4
FAST = TrainSchedule(every=8, fit=FitConfig(steps=5, batch_size=32, optimizer="adam", lr=0.01))


def net_config() -> RewardNetConfig:
    return RewardNetConfig(context_dim=D, n_arms=A, hidden=(8,))


#: Each params class with a field to try to change and a valid value for it.
PARAMS = [
    (EpsilonGreedyParams(), "epsilon", 0.5),
    (NeuralUCBParams(), "lam", 1.0),
    (NeuralLinearParams(), "a0", 1.0),
    (BootstrapParams(), "q", 5),
    (DropoutParams(), "keep_prob", 0.5),
    (ParamNoiseParams(), "noise_std", 0.5),
    (RofuConfig(), "eta", 0.5),
]


@pytest.mark.parametrize(
    ("params", "field", "value"), PARAMS, ids=[type(c[0]).__name__ for c in PARAMS]
)
def test_policy_params_are_frozen(params, field, value):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(params, field, value)
    assert dataclasses.replace(params, **{field: value}) != params


#: (class, its defaults as documented, and its default schedule).
DEFAULTS = [
    (EpsilonGreedy, EpsilonGreedyParams(epsilon=0.05), TrainSchedule()),
    (Greedy, EpsilonGreedyParams(epsilon=0.0), TrainSchedule()),
    (
        NeuralUCB,
        NeuralUCBParams(lam=1e-3, nu=1.0, z="diag", full_max_params=2000),
        NEURALUCB_SCHEDULE,
    ),
    (
        NeuralLinear,
        NeuralLinearParams(a0=6.0, b0=6.0, lambda_prior=0.25, propensity_samples=32),
        TrainSchedule(),
    ),
    (Bootstrap, BootstrapParams(q=3, p=0.95), TrainSchedule()),
    (Dropout, DropoutParams(keep_prob=0.8, propensity_samples=32), TrainSchedule()),
    (
        ParamNoise,
        ParamNoiseParams(noise_std=0.05, eps=0.1, d_samples=300, propensity_samples=32),
        TrainSchedule(),
    ),
    (RofuPolicy, PRODUCT.rofu, PRODUCT.schedule),
]


@pytest.mark.parametrize(
    ("cls", "params", "schedule"), DEFAULTS, ids=[c[0].__name__ for c in DEFAULTS]
)
def test_policy_default_params_are_the_documented_ones(cls, params, schedule):
    policy = cls(net_config())
    assert policy.params == params
    assert policy.schedule == schedule
    assert configuration(policy)["params"] == dataclasses.asdict(params), "run files record it"


def test_policy_params_feed_the_policy():
    assert EpsilonGreedy(net_config(), params=EpsilonGreedyParams(epsilon=0.3)).epsilon == 0.3
    ucb = NeuralUCB(net_config(), params=NeuralUCBParams(lam=0.5, nu=2.0, z="full"))
    assert (ucb.lam, ucb.nu, ucb.full) == (0.5, 2.0, True)
    rofu = RofuConfig(steps=2)
    assert RofuPolicy(net_config(), FAST, rofu).rofu is rofu
    assert len(Bootstrap(net_config(), params=BootstrapParams(q=5)).members) == 5
    dropout = Dropout(net_config(), params=DropoutParams(keep_prob=0.6))
    assert dropout.net.config.dropout == pytest.approx(0.4)


def test_paramnoise_adapts_its_noise_but_not_its_params():
    params = ParamNoiseParams(d_samples=20, propensity_samples=0)
    policy = ParamNoise(net_config(), FAST, params)
    assert (policy.noise_std, policy.eps) == (0.05, 0.1)
    policy.update(linear_problem(8, D, A, seed=1)[1])  # one refit adapts both
    assert policy.noise_std in (pytest.approx(0.05 * 1.01), pytest.approx(0.05 / 1.01))
    assert policy.eps == pytest.approx(0.1 * 0.99)
    assert policy.params == params


def test_greedy_refuses_a_nonzero_epsilon_and_takes_zero():
    with pytest.raises(ValueError, match=r"^epsilon must be 0 for Greedy"):
        Greedy(net_config(), params=EpsilonGreedyParams(epsilon=0.1))
    assert Greedy(net_config(), params=EpsilonGreedyParams(epsilon=0.0)).epsilon == 0.0


WRONG_TYPES = [
    (NeuralUCB, EpsilonGreedyParams(), "NeuralUCBParams"),
    (RofuPolicy, NeuralUCBParams(), "RofuConfig"),
    (Greedy, NeuralUCBParams(), "EpsilonGreedyParams"),
    (NeuralLinear, DropoutParams(), "NeuralLinearParams"),
    (Bootstrap, {"q": 3}, "BootstrapParams"),
    (ParamNoise, RofuConfig(), "ParamNoiseParams"),
]


@pytest.mark.parametrize(("cls", "params", "want"), WRONG_TYPES, ids=[c[2] for c in WRONG_TYPES])
def test_policy_refuses_params_of_another_type(cls: type[NeuralPolicy], params, want):
    got = type(params).__name__
    with pytest.raises(TypeError, match=rf"^params must be a {want} for {cls.__name__}, got {got}"):
        cls(net_config(), FAST, params)


def test_policy_refuses_params_in_the_schedule_slot():
    with pytest.raises(TypeError, match=r"^schedule must be a TrainSchedule, got NeuralUCBParams"):
        NeuralUCB(net_config(), NeuralUCBParams())  # type: ignore[arg-type]
