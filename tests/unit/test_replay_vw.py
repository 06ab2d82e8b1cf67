"""Vowpal Wabbit policies (rofu/replay/simulation/vw.py): interface, determinism, learning, cost
sign, errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rofu.models.data import Transitions
from rofu.models.policies import Uniform
from rofu.replay.simulation.vw import (
    VowpalWabbit,
    VowpalWabbitEpsilonGreedy,
    VowpalWabbitSquareCB,
    adf_lines,
)

POLICIES = [VowpalWabbitSquareCB, VowpalWabbitEpsilonGreedy]


@pytest.fixture(params=POLICIES, ids=lambda cls: cls.name)
def policy_cls(request: pytest.FixtureRequest) -> type[VowpalWabbit]:
    return request.param


def linear_stream(seed: int, rounds: int = 400, dim: int = 5, arms: int = 4):
    """A linear-Gaussian bandit: contexts (T, D), expected rewards and realised rewards (T, A)."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(arms, dim))
    x = rng.normal(size=(rounds, dim)).astype(np.float32)
    means = x.astype(np.float64) @ theta.T
    rewards = means + 0.1 * rng.normal(size=means.shape)
    return torch.from_numpy(x), means, rewards


def pseudo_regret(policy, x, means, rewards) -> float:
    """Run the policy one round at a time; sum of best mean minus chosen mean."""
    total = 0.0
    for t in range(x.shape[0]):
        decision = policy.select(x[t : t + 1])
        arm = int(decision.arms[0])
        total += means[t].max() - means[t, arm]
        reward = torch.tensor([rewards[t, arm]], dtype=torch.float32)
        policy.update(Transitions(x[t : t + 1], decision.arms, reward))
    return total


def test_adf_lines_skip_zeros_and_label_the_chosen_arm():
    lines = adf_lines(np.array([1.5, 0.0, -2.0]), [0, 2], (2, -1.0, 0.25))
    assert lines == ["shared |s c0:1.5 c2:-2", "|a a=0", "2:-1:0.25 |a a=2"]
    assert adf_lines(np.zeros(2), [1], None) == ["shared |s", "|a a=1"]


def test_vw_arguments_name_the_explorer():
    assert (
        "--squarecb --gamma_scale 10.0 --gamma_exponent 0.5" in VowpalWabbitSquareCB(2, 3).arguments
    )
    greedy = VowpalWabbitEpsilonGreedy(2, 3, seed=4).arguments
    assert "--epsilon 0.05" in greedy
    assert "--interactions sa" in greedy
    assert "--random_seed 4" in greedy


def test_vw_select_respects_candidates_and_reports_the_pmf_entry(policy_cls):
    policy = policy_cls(3, 5, seed=0)
    generator = torch.Generator().manual_seed(0)
    x, _, rewards = linear_stream(1, rounds=60, dim=3, arms=5)
    for t in range(0, 60, 6):
        batch = x[t : t + 6]
        mask = torch.rand(6, 5, generator=generator) < 0.5
        mask[torch.arange(6), torch.randint(5, (6,), generator=generator)] = True
        pmf, _ = policy.predict_pmf(batch, mask)
        decision = policy.select(batch, mask)
        assert decision.arms.shape == (6,)
        assert decision.arms.dtype == torch.int64
        assert decision.propensity.dtype == torch.float64
        assert decision.scores.mean.shape == (6, 5)
        assert bool(mask.gather(1, decision.arms[:, None]).all())
        assert bool((decision.propensity > 0).all())
        assert bool((decision.propensity <= 1).all())
        assert torch.equal(decision.propensity, pmf.gather(1, decision.arms[:, None]).squeeze(1))
        assert torch.allclose(pmf.sum(dim=1), torch.ones(6, dtype=torch.float64))
        assert bool((pmf[~mask] == 0).all())
        assert bool(decision.scores.mean[~mask].isnan().all())
        assert bool(decision.scores.mean[mask].isfinite().all())
        assert bool((decision.scores.bonus[mask] == 0).all())
        arms = decision.arms
        observed = torch.from_numpy(rewards[t : t + 6][np.arange(6), arms.numpy()]).float()
        policy.update(Transitions(batch, arms, observed))


def test_vw_predict_pmf_matches_vw_on_the_same_lines():
    policy = VowpalWabbitEpsilonGreedy(2, 3, epsilon=0.3, seed=0)
    x = torch.tensor([[1.0, -0.5]])
    policy.update(Transitions(x, torch.tensor([2]), torch.tensor([1.0])))
    pmf, reward = policy.predict_pmf(x)
    direct = policy.workspace.predict(adf_lines(x[0].double().numpy(), [0, 1, 2], None))
    assert pmf[0].tolist() == pytest.approx(direct, rel=1e-6)
    # epsilon-greedy: 1 - 0.3 + 0.3 / 3 on the best predicted reward, 0.1 elsewhere
    assert int(reward[0].argmax()) == 2
    assert pmf[0].tolist() == pytest.approx([0.1, 0.1, 0.8], rel=1e-6)


def test_vw_sampling_never_draws_a_zero_probability_arm():
    class Draws:
        def random(self, size: int) -> np.ndarray:
            return np.array([0.0, 0.5, 0.9999999])[:size]

    policy = VowpalWabbitSquareCB(2, 4)
    policy.rng = Draws()
    # float32 PMFs can sum to slightly less than 1: the last draw lies beyond the total
    pmf = torch.tensor([[0.0, 0.5, 0.0, 0.4999]] * 3, dtype=torch.float64)
    assert policy._sample(pmf).tolist() == [1, 3, 3]
    pmf = torch.tensor([[0.5, 0.4999, 0.0, 0.0]] * 3, dtype=torch.float64)
    assert policy._sample(pmf).tolist() == [0, 1, 1]


def test_vw_same_seed_same_run(policy_cls):
    x, means, rewards = linear_stream(2, rounds=80)
    runs = []
    for seed in (3, 3, 4):
        policy = policy_cls(5, 4, seed=seed)
        arms, propensities = [], []
        for t in range(80):
            decision = policy.select(x[t : t + 1])
            arms.append(int(decision.arms[0]))
            propensities.append(float(decision.propensity[0]))
            reward = torch.tensor([rewards[t, arms[-1]]], dtype=torch.float32)
            policy.update(Transitions(x[t : t + 1], decision.arms, reward))
        runs.append((arms, propensities))
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0]
    assert len(set(runs[0][0])) > 1


def test_vw_learns_a_linear_bandit_better_than_uniform(policy_cls):
    x, means, rewards = linear_stream(0)
    uniform = pseudo_regret(Uniform(5, 4, seed=0), x, means, rewards)
    learned = pseudo_regret(policy_cls(5, 4, seed=0), x, means, rewards)
    assert learned < 0.6 * uniform


def test_vw_cost_is_minus_reward(policy_cls):
    policy = policy_cls(2, 2, seed=0)
    x = torch.tensor([[1.0, 0.5]])
    for t in range(60):
        arm = torch.tensor([t % 2])  # a round-robin warm start: not the policy's choices
        metrics = policy.update(Transitions(x, arm, torch.tensor([float(t % 2)])))
        assert metrics == {"rows": 1.0, "recorded_propensity": 0.0}
    pmf, reward = policy.predict_pmf(x)
    assert float(reward[0, 1]) > float(reward[0, 0])
    assert float(pmf[0, 1]) > 0.9


def test_vw_update_labels_the_choice_with_its_recorded_propensity(policy_cls):
    policies = [policy_cls(2, 3, seed=0) for _ in range(3)]
    x = torch.tensor([[0.3, -1.0]])
    for policy in policies:  # so that VW's PMF is no longer uniform
        policy.update(Transitions(x, torch.tensor([1]), torch.tensor([1.0])))
    decision = policies[0].select(x)
    arm, propensity = int(decision.arms[0]), float(decision.propensity[0])
    assert propensity != pytest.approx(1 / 3)
    metrics = policies[0].update(Transitions(x, decision.arms, torch.tensor([0.5])))
    assert metrics["recorded_propensity"] == 1.0
    lines = adf_lines(x[0].double().numpy(), [0, 1, 2], (arm, -0.5, propensity))
    policies[1].workspace.learn(lines)
    lines = adf_lines(x[0].double().numpy(), [0, 1, 2], (arm, -0.5, 1 / 3))
    policies[2].workspace.learn(lines)
    rewards = [policy.predict_pmf(x)[1] for policy in policies]
    assert torch.equal(rewards[0], rewards[1])
    if policy_cls is VowpalWabbitSquareCB:  # VW's SquareCB regresses without importance weights
        assert torch.equal(rewards[0], rewards[2])
    else:
        assert not torch.equal(rewards[0], rewards[2])


def test_vw_update_uses_a_record_once_and_only_for_its_arm(policy_cls):
    policy = policy_cls(2, 3, seed=0)
    x = torch.tensor([[0.3, -1.0], [2.0, 0.0]])
    decision = policy.select(x)
    other = (decision.arms[1:] + 1) % 3
    arms = torch.cat([decision.arms[:1], other])
    metrics = policy.update(Transitions(x, arms, torch.zeros(2)))
    assert metrics["recorded_propensity"] == 1.0
    metrics = policy.update(Transitions(x, decision.arms, torch.zeros(2)))
    assert metrics["recorded_propensity"] == 0.0


def test_vw_bad_inputs_name_the_argument(policy_cls):
    policy = policy_cls(3, 4)
    with pytest.raises(ValueError, match="contexts"):
        policy.select(torch.zeros(2, 5))
    with pytest.raises(TypeError, match="contexts"):
        policy.select(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="contexts"):
        policy.select(torch.tensor([[float("nan"), 0.0, 0.0]]))
    with pytest.raises(ValueError, match="candidates"):
        policy.select(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="candidates"):
        policy.select(torch.zeros(1, 3), torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="batch"):
        policy.update({"x": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="batch.arms"):
        policy.update(Transitions(torch.zeros(1, 3), torch.tensor([4]), torch.zeros(1)))
    with pytest.raises(ValueError, match="batch.x"):
        policy.update(Transitions(torch.zeros(1, 2), torch.tensor([0]), torch.zeros(1)))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: VowpalWabbitSquareCB(0, 2), "context_dim"),
        (lambda: VowpalWabbitSquareCB(2, 0), "n_arms"),
        (lambda: VowpalWabbitSquareCB(2, 2, seed=-1), "seed"),
        (lambda: VowpalWabbitSquareCB(2, 2, gamma_scale=0.0), "gamma_scale"),
        (lambda: VowpalWabbitSquareCB(2, 2, gamma_exponent=-1.0), "gamma_exponent"),
        (lambda: VowpalWabbitEpsilonGreedy(2, 2, epsilon=1.5), "epsilon"),
        (lambda: VowpalWabbitEpsilonGreedy(2, 2, epsilon=float("nan")), "epsilon"),
    ],
)
def test_vw_bad_hyperparameters_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


def test_vw_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vowpalwabbit", None)
    with pytest.raises(ImportError, match=r"pip install 'rofu\[vw\]'"):
        VowpalWabbitSquareCB(2, 2)
