"""Bandit policies under one interface: `select` (with propensity) and `update` (metrics).

Every policy scores candidates as mean + bonus and chooses the argmax (ties uniformly), so
decisions, propensities and logging are shared (see `models.policies.base`).
"""

from models.policies.base import Policy
from models.policies.neural import (
    NEURALUCB_SCHEDULE,
    EpsilonGreedy,
    Greedy,
    NeuralPolicy,
    NeuralUCB,
    RofuPolicy,
)
from models.policies.simple import LinUCB, Uniform
from models.policies.thompson import Bootstrap, Dropout, NeuralLinear, ParamNoise
from models.training import SHOWDOWN_FIT, TrainSchedule

__all__ = [
    "NEURALUCB_SCHEDULE",
    "SHOWDOWN_FIT",
    "Bootstrap",
    "Dropout",
    "EpsilonGreedy",
    "Greedy",
    "LinUCB",
    "NeuralLinear",
    "NeuralPolicy",
    "NeuralUCB",
    "ParamNoise",
    "Policy",
    "RofuPolicy",
    "TrainSchedule",
    "Uniform",
]
