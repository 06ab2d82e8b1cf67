"""A quick-style replay on a small bandit: ROFU learns, runs are reproducible per seed."""

from __future__ import annotations

import numpy as np
import torch

from rofu.replay.simulation.bandits import MLPBandit
from rofu.replay.simulation.policies import build_policy
from rofu.replay.simulation.simulate import simulate

ROUNDS = 500


def _run(name: str, seed: int):
    bandit = MLPBandit()
    policy = build_policy(name, bandit.context_dim, bandit.n_arms, seed, torch.device("cpu"))
    return simulate(policy, bandit.stream(ROUNDS, seed), policy_name=name, seed=seed)


def test_replay_smoke_rofu_beats_uniform_and_greedy_is_reproducible():
    for seed in (0, 1):
        rofu, uniform = _run("ROFU", seed), _run("Uniform", seed)
        assert rofu.final_pseudo_regret < 0.5 * uniform.final_pseudo_regret, seed
    first, second = _run("Greedy", 3), _run("Greedy", 3)
    np.testing.assert_array_equal(first.arms, second.arms)
    assert first.final_regret == second.final_regret
