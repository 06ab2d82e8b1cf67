"""Bandit policies under one interface: `select` (with propensity) and `update` (metrics).

Every policy scores candidates as mean + bonus and chooses the argmax (ties uniformly), so
decisions, propensities and logging are shared (see `rofu.models.policies.base`). A neural
policy's hyper-parameters are one frozen dataclass (`rofu.models.policies.params`; ROFU's is
`RofuConfig`), given as `params`.
"""

from rofu.models.policies.base import Policy
from rofu.models.policies.matched import NeuralLinUCB, SquareCB
from rofu.models.policies.neural import EpsilonGreedy, Greedy, NeuralPolicy, RofuPolicy
from rofu.models.policies.neural_ucb import NEURALUCB_SCHEDULE, NeuralUCB
from rofu.models.policies.params import (
    BootstrapParams,
    DropoutParams,
    EpsilonGreedyParams,
    NeuralLinearParams,
    NeuralLinUCBParams,
    NeuralUCBParams,
    ParamNoiseParams,
    SquareCBParams,
    ThompsonParams,
)
from rofu.models.policies.simple import LinUCB, Uniform
from rofu.models.policies.thompson import Bootstrap, Dropout, NeuralLinear, ParamNoise
from rofu.models.rofu_config import RofuConfig
from rofu.models.training import SHOWDOWN_FIT, TrainSchedule

__all__ = [
    "NEURALUCB_SCHEDULE",
    "SHOWDOWN_FIT",
    "Bootstrap",
    "BootstrapParams",
    "Dropout",
    "DropoutParams",
    "EpsilonGreedy",
    "EpsilonGreedyParams",
    "Greedy",
    "LinUCB",
    "NeuralLinear",
    "NeuralLinUCB",
    "NeuralLinUCBParams",
    "NeuralLinearParams",
    "NeuralPolicy",
    "NeuralUCB",
    "NeuralUCBParams",
    "ParamNoise",
    "ParamNoiseParams",
    "Policy",
    "RofuConfig",
    "RofuPolicy",
    "SquareCB",
    "SquareCBParams",
    "ThompsonParams",
    "TrainSchedule",
    "Uniform",
]
