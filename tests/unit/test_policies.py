"""Every policy in `rofu.models.policies`: the shared interface, determinism, propensities,
closed-form equivalences (LinUCB, NeuralUCB, NeuralLinear, ROFU), the training schedule,
learning sanity on a linear bandit, and refusal of bad input."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from rofu.models import FitConfig, RewardNetConfig, RofuConfig, Transitions, rofu_scores
from rofu.models.policies import (
    Bootstrap,
    BootstrapParams,
    Dropout,
    DropoutParams,
    EpsilonGreedy,
    EpsilonGreedyParams,
    Greedy,
    LinUCB,
    NeuralLinear,
    NeuralLinearParams,
    NeuralPolicy,
    NeuralUCB,
    NeuralUCBParams,
    ParamNoise,
    ParamNoiseParams,
    Policy,
    RofuPolicy,
    TrainSchedule,
    Uniform,
)
from rofu.models.scores import Decision, Scores
from tests.factories import arm_features, linear_problem

D, A, F = 5, 4, 3  # context features, arms, arm features
FAST_FIT = FitConfig(steps=5, batch_size=32, optimizer="adam", lr=0.01)
FAST = TrainSchedule(every=8, fit=FAST_FIT)
NEVER = TrainSchedule(every=10**9, fit=FAST_FIT)  # the network stays at its init
FAST_ROFU = RofuConfig(steps=3, step_size=0.05, minibatch_size=16)


def net_config(
    hidden: tuple[int, ...] = (8,), *, seed: int = 0, features: bool = False
) -> RewardNetConfig:
    if features:
        return RewardNetConfig(context_dim=D, arm_feature_dim=F, hidden=hidden, seed=seed)
    return RewardNetConfig(context_dim=D, n_arms=A, hidden=hidden, seed=seed)


FEATURES = arm_features(A, F, seed=3)  # float64, as callers naturally build them

BUILDERS: dict[str, Callable[[int], Policy]] = {
    "Uniform": lambda seed: Uniform(D, A, seed=seed),
    "Greedy": lambda seed: Greedy(net_config(), FAST, seed=seed),
    "EpsilonGreedy": lambda seed: EpsilonGreedy(
        net_config(), FAST, EpsilonGreedyParams(epsilon=0.3), seed=seed
    ),
    "LinUCB": lambda seed: LinUCB(D, A, alpha=0.8, seed=seed),
    "NeuralUCB-diag": lambda seed: NeuralUCB(
        net_config(), FAST, NeuralUCBParams(lam=0.5, z="diag"), seed=seed
    ),
    "NeuralUCB-full": lambda seed: NeuralUCB(
        net_config(), FAST, NeuralUCBParams(lam=0.5, z="full"), seed=seed
    ),
    "NeuralUCB-auto": lambda seed: NeuralUCB(
        net_config(), FAST, NeuralUCBParams(lam=0.5, z="auto"), seed=seed
    ),
    "NeuralLinear": lambda seed: NeuralLinear(
        net_config(), FAST, NeuralLinearParams(propensity_samples=8), seed=seed
    ),
    "Bootstrap": lambda seed: Bootstrap(net_config(), FAST, BootstrapParams(q=3), seed=seed),
    "Dropout": lambda seed: Dropout(
        net_config(), FAST, DropoutParams(propensity_samples=8), seed=seed
    ),
    "ParamNoise": lambda seed: ParamNoise(
        net_config(), FAST, ParamNoiseParams(d_samples=20, propensity_samples=8), seed=seed
    ),
    "ROFU": lambda seed: RofuPolicy(net_config(), FAST, FAST_ROFU, seed=seed),
    "ROFU-arm-features": lambda seed: RofuPolicy(
        net_config(features=True), FAST, FAST_ROFU, arm_features=FEATURES, seed=seed
    ),
    "NeuralUCB-arm-features": lambda seed: NeuralUCB(
        net_config(features=True), FAST, NeuralUCBParams(z="full"), arm_features=FEATURES, seed=seed
    ),
    "NeuralLinear-arm-features": lambda seed: NeuralLinear(
        net_config(features=True),
        FAST,
        NeuralLinearParams(propensity_samples=8),
        arm_features=FEATURES,
        seed=seed,
    ),
    "Dropout-arm-features": lambda seed: Dropout(
        net_config(features=True),
        FAST,
        DropoutParams(propensity_samples=8),
        arm_features=FEATURES,
        seed=seed,
    ),
}
ALL = sorted(BUILDERS)
NEURAL = [name for name in ALL if name not in ("Uniform", "LinUCB")]

# (B, A) candidates: a full row, a single candidate, two rows with gaps.
MASK = torch.tensor(
    [[True, True, True, True], [False, False, True, False], [True, False, True, False]]
    + [[False, True, True, True]]
)


def contexts(batch: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(batch, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def logged(n: int, *, seed: int = 1) -> Transitions:
    """n uniformly logged pulls of a linear-Gaussian bandit (float64 contexts)."""
    return linear_problem(n, D, A, seed=seed)[1]


def play(policy: Policy, rounds: int, *, batch: int = 3, seed: int = 0) -> list[Decision]:
    """Run the policy online on a seeded linear bandit; returns every decision."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(A, D, generator=gen)
    decisions = []
    for _ in range(rounds):
        x = torch.randn(batch, D, generator=gen)
        decision = policy.select(x)
        noise = 0.1 * torch.randn(batch, generator=gen)
        policy.update(Transitions(x, decision.arms, (x * weights[decision.arms]).sum(1) + noise))
        decisions.append(decision)
    return decisions


def flat_params(policy: NeuralPolicy) -> Tensor:
    return torch.cat([p.detach().flatten() for p in policy.net.parameters()])


# --- the shared interface -------------------------------------------------------------


def _check_decision(decision: Decision, mask: Tensor) -> None:
    batch = mask.shape[0]
    assert isinstance(decision, Decision)
    assert decision.arms.dtype == torch.int64
    assert decision.arms.shape == (batch,)
    assert bool(mask[torch.arange(batch), decision.arms].all()), "arm outside the candidates"
    assert decision.propensity.shape == (batch,)
    assert bool(((decision.propensity > 0) & (decision.propensity <= 1)).all())
    for table in (decision.scores.mean, decision.scores.bonus):
        assert table.shape == (batch, A)
        assert torch.equal(table.isnan(), ~mask), "NaN exactly outside the candidates"


@pytest.mark.parametrize("name", ALL)
def test_policy_select_and_update_honour_the_interface(name):
    policy = BUILDERS[name](0)
    for warm in (False, True):  # before any data, then after a refit
        decision = policy.select(contexts(4, seed=int(warm)), MASK)
        _check_decision(decision, MASK)
        assert float(decision.propensity[1]) == 1.0, "a lone candidate is chosen surely"
        metrics = policy.update(logged(8, seed=int(warm)))
        assert isinstance(metrics, dict)
        assert all(isinstance(k, str) and type(v) is float for k, v in metrics.items())
    full = policy.select(contexts(2, seed=5, dtype=torch.float64))  # no mask: every arm
    _check_decision(full, torch.ones(2, A, dtype=torch.bool))


@pytest.mark.parametrize("name", ALL)
def test_policy_same_seed_same_stream_gives_identical_decisions(name):
    first, second = play(BUILDERS[name](3), 12), play(BUILDERS[name](3), 12)
    for one, two in zip(first, second, strict=True):
        assert torch.equal(one.arms, two.arms)
        assert torch.equal(one.propensity, two.propensity)
        torch.testing.assert_close(one.scores.ucb, two.scores.ucb, equal_nan=True)


@pytest.mark.parametrize(
    "name", ["Uniform", "EpsilonGreedy", "NeuralLinear", "Bootstrap", "Dropout", "ParamNoise"]
)
def test_policy_different_seed_changes_a_randomised_choice(name):
    first = torch.cat([d.arms for d in play(BUILDERS[name](0), 20)])
    second = torch.cat([d.arms for d in play(BUILDERS[name](1), 20)])
    assert not torch.equal(first, second)


# --- propensities ------------------------------------------------------------------------


def test_uniform_propensity_is_one_over_candidates_and_choice_is_uniform():
    policy = Uniform(D, A, seed=0)
    n = 20_000
    mask = torch.tensor([[True, False, True, True]]).expand(n, A)
    decision = policy.select(contexts(n), mask)
    assert torch.equal(decision.propensity, torch.full((n,), 1 / 3, dtype=torch.float64))
    assert bool((decision.scores.mean[mask] == 0).all())
    freq = torch.bincount(decision.arms, minlength=A).double() / n
    se = math.sqrt((1 / 3) * (2 / 3) / n)  # binomial standard error of one frequency
    assert float(freq[1]) == 0.0
    torch.testing.assert_close(
        freq[[0, 2, 3]], torch.full((3,), 1 / 3).double(), atol=5 * se, rtol=0
    )


def test_epsilongreedy_propensity_matches_closed_form_and_frequencies():
    epsilon, n = 0.3, 20_000
    policy = EpsilonGreedy(net_config(), NEVER, EpsilonGreedyParams(epsilon=epsilon), seed=4)
    mask = torch.tensor([[True, True, False, True]])
    x = contexts(1, seed=2)
    mean = policy.net.score_all(x).detach()[0]
    best = int(mean.masked_fill(~mask[0], -math.inf).argmax())
    want = torch.where(mask[0], epsilon / 3, 0.0).double()
    want[best] += 1 - epsilon  # P(a) = eps / K + (1 - eps) [a is the argmax]
    decision = policy.select(x.expand(n, D), mask.expand(n, A))
    torch.testing.assert_close(decision.propensity, want[decision.arms])
    freq = torch.bincount(decision.arms, minlength=A).double() / n
    se = (want * (1 - want) / n).sqrt()  # binomial standard error per arm
    assert bool(((freq - want).abs() <= 5 * se + 1e-12).all()), (freq, want)
    assert float(want[best]) == pytest.approx(0.8)


def test_epsilongreedy_with_epsilon_one_is_uniform_over_candidates():
    policy = EpsilonGreedy(net_config(), NEVER, EpsilonGreedyParams(epsilon=1.0))
    decision = policy.select(contexts(6), MASK[[0, 0, 1, 2, 3, 3]])
    want = 1.0 / MASK[[0, 0, 1, 2, 3, 3]].sum(1).double()
    torch.testing.assert_close(decision.propensity, want)


def _tie_arms_0_and_2(policy: EpsilonGreedy) -> None:
    """Make the network predict the same, highest value for arms 0 and 2 everywhere."""
    last = policy.net.layers[-1]
    with torch.no_grad():
        last.weight[2] = last.weight[0]
        last.bias[2] = last.bias[0]
        last.bias[[1, 3]] = last.bias[0] - 100.0


def test_greedy_ties_are_broken_uniformly_with_propensity_one_over_ties():
    policy, n = Greedy(net_config(), NEVER, seed=5), 4_000
    _tie_arms_0_and_2(policy)
    decision = policy.select(contexts(n, seed=1))
    assert set(decision.arms.unique().tolist()) == {0, 2}
    assert torch.equal(decision.propensity, torch.full((n,), 0.5, dtype=torch.float64))
    share = float((decision.arms == 0).double().mean())
    assert abs(share - 0.5) <= 5 * math.sqrt(0.25 / n)  # 5 binomial standard errors
    alone = policy.select(contexts(3), torch.tensor([[True, True, False, True]] * 3))
    assert torch.equal(alone.arms, torch.zeros(3, dtype=torch.int64))
    assert torch.equal(alone.propensity, torch.ones(3, dtype=torch.float64))


def test_epsilongreedy_propensity_splits_greedy_mass_among_ties():
    epsilon = 0.2
    policy = EpsilonGreedy(net_config(), NEVER, EpsilonGreedyParams(epsilon=epsilon), seed=5)
    _tie_arms_0_and_2(policy)
    decision = policy.select(contexts(500, seed=2))
    tied = (decision.arms == 0) | (decision.arms == 2)
    want = torch.where(tied, epsilon / A + (1 - epsilon) / 2, epsilon / A).double()
    torch.testing.assert_close(decision.propensity, want)
    assert bool((~tied).any()), "exploration must reach an untied arm"


def test_linucb_without_data_ties_every_candidate():
    decision = LinUCB(D, A).select(contexts(4), MASK)
    torch.testing.assert_close(decision.propensity, 1.0 / MASK.sum(1).double())


def test_bootstrap_propensity_is_share_of_members_whose_argmax_is_chosen():
    q, n = 5, 600
    policy = Bootstrap(net_config(), NEVER, BootstrapParams(q=q), seed=2)
    x, mask = contexts(n, seed=8), MASK[torch.arange(n) % 4]
    decision = policy.select(x, mask)
    votes = torch.stack(
        [m.score_all(x).detach().masked_fill(~mask, -math.inf).argmax(1) for m in policy.members]
    )  # (q, B); random inits leave no exact ties
    want = (votes == decision.arms).double().mean(0)
    torch.testing.assert_close(decision.propensity, want)
    assert bool((want < 1).any()), "members must disagree somewhere for the test to bite"
    # the decision follows one member: mean + bonus is that member's score row
    members = torch.stack([m.score_all(x).detach() for m in policy.members])  # (q, B, A)
    ucb = decision.scores.ucb.nan_to_num(0.0)
    hits = [(members[i].masked_fill(~mask, 0) - ucb).abs().amax(1) < 1e-5 for i in range(q)]
    assert bool(torch.stack(hits).any(0).all())


def test_bootstrap_choice_frequency_matches_propensity():
    policy, n = Bootstrap(net_config(), NEVER, BootstrapParams(q=4), seed=2), 8_000
    x = contexts(64, seed=8)
    row = next(
        i
        for i in range(64)
        if len({int(m.score_all(x[i : i + 1]).argmax()) for m in policy.members}) > 1
    )
    decision = policy.select(x[row].expand(n, D))
    for arm in decision.arms.unique().tolist():
        chosen = decision.arms == arm
        p = float(decision.propensity[chosen][0])
        assert bool((decision.propensity[chosen] == p).all())
        assert abs(float(chosen.double().mean()) - p) <= 5 * math.sqrt(p * (1 - p) / n)


def test_neurallinear_monte_carlo_propensity_matches_choice_frequency():
    samples, n = 200, 2_000
    policy = NeuralLinear(
        net_config(), NEVER, NeuralLinearParams(propensity_samples=samples), seed=1
    )
    policy.update(logged(12, seed=1))
    decision = policy.select(contexts(1, seed=0).expand(n, D))
    freq = torch.bincount(decision.arms, minlength=A).double() / n
    assert int(((freq > 0.1) & (freq < 0.9)).sum()) >= 2, "the choice must be genuinely random"
    for arm in decision.arms.unique().tolist():
        p = float(freq[arm])
        # E[(1 + wins) / (1 + S)] = (1 + S p) / (1 + S). The frequency's binomial s.e. is
        # <= 0.011 at n = 2000; each row's estimate has s.e. <= 0.5 / sqrt(S) = 0.035 and
        # the >= 16 rows per arm average it below 0.009: 0.05 is over 3 combined s.e.
        got = float(decision.propensity[decision.arms == arm].mean())
        assert got == pytest.approx((1 + samples * p) / (1 + samples), abs=0.05)


@pytest.mark.parametrize("name", ["NeuralLinear", "Dropout", "ParamNoise"])
def test_thompson_propensity_is_a_count_of_resampled_wins(name):
    policy = BUILDERS[name](0)
    play(policy, 6)
    decision = policy.select(contexts(50, seed=3), MASK[torch.arange(50) % 4])
    wins = decision.propensity * (1 + policy.propensity_samples)
    torch.testing.assert_close(wins, wins.round())  # (1 + wins) / (1 + S), never zero
    assert bool((decision.propensity >= 1 / (1 + policy.propensity_samples)).all())
    assert bool((decision.propensity < 1).any()), "the posterior must be uncertain somewhere"


# --- closed forms --------------------------------------------------------------------------


def test_linucb_scores_equal_closed_form_ridge_per_arm():
    alpha, ridge = 0.7, 2.0
    policy = LinUCB(D, A, alpha=alpha, ridge=ridge)
    data = logged(40, seed=2)
    cuts = [0, 3, 11, 12, 25, 40]  # several updates of uneven size
    for start, stop in zip(cuts, cuts[1:], strict=False):
        policy.update(data.subset(torch.arange(start, stop)))
    x = contexts(6, seed=9, dtype=torch.float64)
    decision = policy.select(x)
    for arm in range(A):
        rows = data.x[data.arms == arm]
        gram = ridge * torch.eye(D, dtype=torch.float64) + rows.T @ rows
        inverse = torch.linalg.inv(gram)
        theta = inverse @ (rows.T @ data.rewards[data.arms == arm])
        torch.testing.assert_close(decision.scores.mean[:, arm], x @ theta)
        bonus = alpha * torch.einsum("bi,ij,bj->b", x, inverse, x).sqrt()
        torch.testing.assert_close(decision.scores.bonus[:, arm], bonus)


def _autograd_gradient(policy: NeuralUCB, x: Tensor, arm: int) -> Tensor:
    """g = d f(x, arm) / d theta by plain backward, flattened in parameter order. (P,)"""
    policy.net.zero_grad(set_to_none=True)
    features = policy.arm_features
    out = policy.net(x[None].float(), torch.tensor([arm]), features)
    out.sum().backward()
    grads = torch.cat([p.grad.flatten() for p in policy.net.parameters()]).double()
    policy.net.zero_grad(set_to_none=True)
    return grads


def _play_and_record_gradients(policy: NeuralUCB, rounds: int) -> list[Tensor]:
    """Feed logged batches; record every chosen pair's gradient at update time."""
    data, gradients = logged(3 * rounds, seed=6), []
    for r in range(rounds):
        batch = data.subset(torch.arange(3 * r, 3 * r + 3))
        pairs = zip(batch.x, batch.arms.tolist(), strict=True)
        gradients += [_autograd_gradient(policy, x, arm) for x, arm in pairs]
        policy.update(batch)
    return gradients


@pytest.mark.parametrize("schedule", [NEVER, TrainSchedule(every=4, fit=FAST_FIT)])
def test_neuralucb_full_bonus_equals_explicit_inverse(schedule):
    lam, nu = 0.5, 2.0
    policy = NeuralUCB(net_config(), schedule, NeuralUCBParams(lam=lam, nu=nu, z="full"))
    gradients = torch.stack(_play_and_record_gradients(policy, 6))  # (N, P)
    z = lam * torch.eye(gradients.shape[1], dtype=torch.float64) + gradients.T @ gradients
    z_inv = torch.linalg.inv(z)
    x = contexts(3, seed=4)
    got = policy.select(x).scores.bonus
    for b in range(3):
        for arm in range(A):
            g = _autograd_gradient(policy, x[b], arm)
            want = math.sqrt(lam * nu * float(g @ z_inv @ g))
            assert float(got[b, arm]) == pytest.approx(want, rel=1e-3)


def test_neuralucb_diag_bonus_equals_diagonal_formula():
    lam, nu = 0.5, 2.0
    policy = NeuralUCB(
        net_config(), TrainSchedule(every=4, fit=FAST_FIT), NeuralUCBParams(lam=lam, nu=nu)
    )
    gradients = torch.stack(_play_and_record_gradients(policy, 6))  # (N, P)
    z_diag = lam + gradients.square().sum(0)  # (P,)
    x = contexts(3, seed=4)
    decision = policy.select(x)
    for b in range(3):
        for arm in range(A):
            g = _autograd_gradient(policy, x[b], arm)
            want = math.sqrt(lam * nu * float((g.square() / z_diag).sum()))
            assert float(decision.scores.bonus[b, arm]) == pytest.approx(want, rel=1e-4)
    mean = policy.net.score_all(x).detach()
    torch.testing.assert_close(decision.scores.mean, mean)


def test_neuralucb_auto_picks_full_only_for_small_networks():
    small = NeuralUCB(net_config((8,)), FAST, NeuralUCBParams(z="auto"))
    capped = NeuralUCB(net_config((8,)), FAST, NeuralUCBParams(z="auto", full_max_params=50))
    large = NeuralUCB(net_config((64, 64)), FAST, NeuralUCBParams(z="auto"))
    assert small.full
    assert small.z_inv.shape == (84, 84)  # 5*8 + 8 + 8*4 + 4 parameters
    assert not capped.full
    assert capped.z_inv.shape == (84,)
    assert not large.full
    assert NeuralUCB(net_config((64, 64)), FAST, NeuralUCBParams(z="full")).full


def _features(policy: NeuralLinear, x: Tensor) -> Tensor:
    """Last hidden layer of a one-hidden-layer ReLU net, by hand. (N, D) -> (N, H)"""
    layer = policy.net.layers[0]
    return torch.relu(x.float() @ layer.weight.T + layer.bias).detach().double()


def _blr_means(policy: NeuralLinear, seen: Transitions, x: Tensor) -> Tensor:
    """Posterior-mean rewards (B, A) of per-arm Bayesian linear regressions on features."""
    phi, query = _features(policy, seen.x), _features(policy, x)
    eye = torch.eye(phi.shape[1], dtype=torch.float64)
    means = []
    for arm in range(A):
        rows = phi[seen.arms == arm]
        precision = policy.params.lambda_prior * eye + rows.T @ rows
        mu = torch.linalg.solve(precision, rows.T @ seen.rewards[seen.arms == arm])
        means.append(query @ mu)
    return torch.stack(means, dim=1)


def test_neurallinear_posterior_mean_equals_closed_form_with_and_without_refit():
    policy = NeuralLinear(net_config(), TrainSchedule(every=20, fit=FAST_FIT), seed=2)
    data, x = logged(35, seed=4), contexts(5, seed=6)
    before = flat_params(policy)
    trained = []
    for stop in (7, 14, 21, 28, 35):
        batch = data.subset(torch.arange(stop - 7, stop))
        trained.append(policy.update(batch)["trained"])
        seen = data.subset(torch.arange(stop))
        want = _blr_means(policy, seen, x)  # float32 features: float32 tolerances
        torch.testing.assert_close(policy.predict(x), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(policy.select(x).scores.mean, want, rtol=1e-5, atol=1e-6)
    assert trained == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert not torch.equal(before, flat_params(policy)), "the refit must move the features"


def test_neurallinear_noise_posterior_matches_normal_inverse_gamma():
    policy = NeuralLinear(net_config(), NEVER, NeuralLinearParams(a0=3.0, b0=2.0, lambda_prior=0.5))
    data = logged(30, seed=5)
    policy.update(data)
    mu, chol, a, b = policy.posterior()
    phi = _features(policy, data.x)
    for arm in range(A):
        rows, y = phi[data.arms == arm], data.rewards[data.arms == arm]
        precision = 0.5 * torch.eye(8, dtype=torch.float64) + rows.T @ rows
        want_mu = torch.linalg.solve(precision, rows.T @ y)
        torch.testing.assert_close(mu[arm], want_mu)
        torch.testing.assert_close(chol[arm] @ chol[arm].T, torch.linalg.inv(precision))
        assert float(a[arm]) == pytest.approx(3.0 + len(y) / 2)
        assert float(b[arm]) == pytest.approx(
            2.0 + 0.5 * float(y @ y - want_mu @ precision @ want_mu)
        )


def test_rofu_policy_without_data_is_uniform_with_infinite_bonus():
    policy, n = RofuPolicy(net_config(), FAST, FAST_ROFU), 6_000
    mask = MASK[torch.arange(n) % 4]
    decision = policy.select(contexts(n, seed=3), mask)
    assert bool((decision.scores.bonus[mask] == math.inf).all())
    torch.testing.assert_close(decision.propensity, 1.0 / mask.sum(1).double())
    full_rows = decision.arms[0::4]  # rows whose mask is all-True
    freq = torch.bincount(full_rows, minlength=A).double() / len(full_rows)
    se = math.sqrt(0.25 * 0.75 / len(full_rows))
    torch.testing.assert_close(freq, torch.full((A,), 0.25).double(), atol=5 * se, rtol=0)


@pytest.mark.parametrize("features", [False, True])
def test_rofu_policy_scores_equal_rofu_scores_on_its_buffer(features):
    kwargs = {"arm_features": FEATURES} if features else {}
    rofu = RofuConfig(steps=3, step_size=0.1, minibatch_size=16)  # minibatches: |D| = 30
    schedule = TrainSchedule(every=30, fit=FitConfig(steps=300, batch_size=30, lr=0.02))
    policy = RofuPolicy(net_config(features=features), schedule, rofu, seed=1, **kwargs)
    for part in range(3):
        policy.update(logged(10, seed=part))
    assert len(policy.buffer) == 30
    x = contexts(4, seed=2)
    generator = torch.Generator()
    generator.set_state(policy.generator.get_state())  # the minibatches the policy will draw
    decision = policy.select(x, MASK)
    want = rofu_scores(
        policy.net,
        x,
        policy.buffer.regulariser_data(A),
        rofu,
        generator,
        candidates=MASK,
        arm_features=policy.arm_features,
    )
    torch.testing.assert_close(decision.scores.mean, want.mean, equal_nan=True)
    torch.testing.assert_close(decision.scores.bonus, want.bonus, equal_nan=True)
    net_mean = policy.net.score_all(x, policy.arm_features).detach().masked_fill(~MASK, math.nan)
    torch.testing.assert_close(decision.scores.mean, net_mean, equal_nan=True)
    assert bool((decision.scores.bonus[MASK] > 0).all())


# --- the training schedule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "dense_until", "before", "after", "due"),
    [
        (5, 0, 0, 4, False),
        (5, 0, 4, 5, True),
        (5, 0, 0, 5, True),
        (5, 0, 5, 9, False),
        (5, 0, 3, 12, True),  # crosses two boundaries: one refit
        (5, 0, 10, 10, False),
        (5, 3, 0, 1, True),  # dense: every growth below dense_until
        (5, 3, 2, 3, True),
        (5, 3, 3, 4, False),  # dense phase over, back to every 5
        (5, 3, 4, 5, True),
        (5, 3, 2, 2, False),  # no new rows, no refit
        (1, 0, 7, 8, True),
    ],
)
def test_trainschedule_due(every, dense_until, before, after, due):
    assert TrainSchedule(every=every, dense_until=dense_until).due(before, after) is due


@pytest.mark.parametrize("name", NEURAL)
def test_policy_refits_exactly_when_due(name):
    policy = BUILDERS[name](0)
    assert isinstance(policy, NeuralPolicy)
    policy.schedule = TrainSchedule(every=4, dense_until=2, fit=FAST_FIT)
    data, held, pattern = logged(20, seed=3), 0, []
    for size in (1, 1, 1, 1, 2, 3, 1, 5, 1, 4):
        before = flat_params(policy)
        metrics = policy.update(data.subset(torch.arange(held, held + size)))
        due = policy.schedule.due(held, held + size)
        held += size
        pattern.append(metrics["trained"])
        assert metrics["trained"] == float(due)
        assert (not torch.equal(before, flat_params(policy))) is due, "weights move iff refit"
        assert len(policy.buffer) == held
    assert set(pattern) == {0.0, 1.0}


@pytest.mark.parametrize("name", NEURAL)
def test_persist_keeps_each_networks_optimizer_across_refits(name):
    policy = BUILDERS[name](0)
    assert isinstance(policy, NeuralPolicy)
    assert policy.optimizer_for(policy.net) is None, "a fresh optimizer per refit by default"
    policy.schedule = TrainSchedule(every=4, fit=FAST_FIT, persist=True)
    data = logged(16, seed=3)
    for start in range(0, 16, 4):
        assert policy.update(data.subset(torch.arange(start, start + 4)))["trained"] == 1.0
    optimizer = policy.optimizer_for(policy.net)
    assert optimizer is not None
    assert optimizer is policy.optimizer_for(policy.net)
    steps = {float(state["step"]) for state in optimizer.state.values()}
    assert steps == {4.0 * FAST_FIT.steps}, "Adam's state counts every refit's steps"
    policy.schedule = TrainSchedule(every=4, fit=FitConfig(steps=2, optimizer="sgd"), persist=True)
    assert isinstance(policy.optimizer_for(policy.net), torch.optim.SGD), "a new config restarts"


# --- learning sanity ---------------------------------------------------------------------


def _pseudo_regret(policy: Policy, rounds: int = 60, batch: int = 5) -> float:
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(A, D, generator=gen)
    total = 0.0
    for _ in range(rounds):
        x = torch.randn(batch, D, generator=gen)
        mu = x @ weights.T  # (B, A) true mean rewards
        arms = policy.select(x).arms
        chosen = mu.gather(1, arms[:, None]).squeeze(1)
        total += float((mu.max(1).values - chosen).sum())
        rewards = chosen + 0.1 * torch.randn(batch, generator=gen)
        policy.update(Transitions(x, arms, rewards))
    return total


def test_linucb_and_rofu_regret_beat_uniform_on_a_linear_bandit():
    uniform = _pseudo_regret(Uniform(D, A))
    linucb = _pseudo_regret(LinUCB(D, A))
    rofu = _pseudo_regret(RofuPolicy(net_config((16,))))  # paper defaults, 300 rounds
    assert linucb < 0.25 * uniform, (linucb, uniform)
    assert rofu < 0.5 * uniform, (rofu, uniform)


# --- bad input -----------------------------------------------------------------------------

BAD_SELECTS = [
    ("wrong width", lambda: (torch.randn(2, D + 1), None), ValueError, "^contexts"),
    ("1-d", lambda: (torch.randn(D), None), ValueError, "^contexts"),
    ("NaN", lambda: (torch.full((2, D), math.nan), None), ValueError, "^contexts"),
    ("inf", lambda: (torch.tensor([[math.inf] + [0.0] * (D - 1)]), None), ValueError, "^contexts"),
    ("integer", lambda: (torch.ones(2, D, dtype=torch.int64), None), TypeError, "^contexts"),
    ("list", lambda: ([[0.0] * D], None), TypeError, "^contexts"),
    (
        "no candidate",
        lambda: (torch.randn(2, D), torch.tensor([[True] * A, [False] * A])),
        ValueError,
        "^candidates",
    ),
    (
        "mask shape",
        lambda: (torch.randn(2, D), torch.ones(2, A + 1).bool()),
        ValueError,
        "^candidates",
    ),
    ("mask rows", lambda: (torch.randn(2, D), torch.ones(3, A).bool()), ValueError, "^candidates"),
    ("mask dtype", lambda: (torch.randn(2, D), torch.ones(2, A)), TypeError, "^candidates"),
]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("make", "error", "match"), [c[1:] for c in BAD_SELECTS], ids=[c[0] for c in BAD_SELECTS]
)
def test_policy_select_rejects_bad_input(name, make, error, match):
    policy = BUILDERS[name](0)
    policy.update(logged(6))
    x, candidates = make()
    with pytest.raises(error, match=match):
        policy.select(x, candidates)


def _state(policy: Policy) -> dict[str, object]:
    """Every tensor, generator state and buffer length a policy holds."""
    state: dict[str, object] = {}
    for key, value in vars(policy).items():
        if isinstance(value, Tensor):
            state[key] = value.clone()
        elif isinstance(value, torch.Generator):
            state[key] = value.get_state()
    if isinstance(policy, NeuralPolicy):
        state["buffer"] = len(policy.buffer)
        state["params"] = flat_params(policy)
        state["counts"] = policy.buffer.arm_counts.clone()
    return state


def _arm_too_large() -> Transitions:
    return Transitions(torch.randn(3, D), torch.tensor([0, A, 1]), torch.randn(3))


BAD_UPDATES = [
    ("arm index", _arm_too_large, ValueError, "^batch.arms"),
    (
        "width",
        lambda: Transitions(torch.randn(2, D + 2), torch.tensor([0, 1]), torch.randn(2)),
        ValueError,
        "^batch.x",
    ),
    ("dict", lambda: {"x": torch.randn(2, D)}, TypeError, "^batch must be Transitions"),
    (
        "tuple",
        lambda: (torch.randn(2, D), torch.tensor([0, 1]), torch.randn(2)),
        TypeError,
        "^batch",
    ),
]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("make", "error", "match"), [c[1:] for c in BAD_UPDATES], ids=[c[0] for c in BAD_UPDATES]
)
def test_policy_rejected_update_changes_nothing(name, make, error, match):
    policy = BUILDERS[name](0)
    policy.update(logged(6))
    before = _state(policy)
    with pytest.raises(error, match=match):
        policy.update(make())
    after = _state(policy)
    assert before.keys() == after.keys()
    for key, value in before.items():
        same = torch.equal(value, after[key]) if isinstance(value, Tensor) else value == after[key]
        assert same, f"{key} changed"


BAD_HYPERPARAMETERS = [
    ("epsilon", lambda: EpsilonGreedyParams(epsilon=1.5), ValueError),
    ("epsilon", lambda: EpsilonGreedyParams(epsilon=-0.1), ValueError),
    ("epsilon", lambda: Greedy(net_config(), params=EpsilonGreedyParams(epsilon=0.1)), ValueError),
    ("q", lambda: BootstrapParams(q=0), ValueError),
    ("q", lambda: BootstrapParams(q=2.0), TypeError),
    ("p", lambda: BootstrapParams(p=0.0), ValueError),
    ("keep_prob", lambda: DropoutParams(keep_prob=0.0), ValueError),
    ("keep_prob", lambda: DropoutParams(keep_prob=1.2), ValueError),
    ("lam", lambda: NeuralUCBParams(lam=-1.0), ValueError),
    ("lam", lambda: NeuralUCBParams(lam=0.0), ValueError),
    ("nu", lambda: NeuralUCBParams(nu=-1.0), ValueError),
    ("z", lambda: NeuralUCBParams(z="dense"), ValueError),
    ("full_max_params", lambda: NeuralUCBParams(full_max_params=-1), ValueError),
    ("ridge", lambda: LinUCB(D, A, ridge=0.0), ValueError),
    ("alpha", lambda: LinUCB(D, A, alpha=-1.0), ValueError),
    ("alpha", lambda: LinUCB(D, A, alpha=math.nan), ValueError),
    ("n_arms", lambda: Uniform(D, 0), ValueError),
    ("context_dim", lambda: LinUCB(0, A), ValueError),
    ("seed", lambda: Uniform(D, A, seed=-1), ValueError),
    ("seed", lambda: Greedy(net_config(), seed=-1), ValueError),
    ("a0", lambda: NeuralLinearParams(a0=0.0), ValueError),
    ("b0", lambda: NeuralLinearParams(b0=-1.0), ValueError),
    ("lambda_prior", lambda: NeuralLinearParams(lambda_prior=-1.0), ValueError),
    ("propensity_samples", lambda: NeuralLinearParams(propensity_samples=-1), ValueError),
    ("propensity_samples", lambda: DropoutParams(propensity_samples=1.5), TypeError),
    ("noise_std", lambda: ParamNoiseParams(noise_std=-0.1), ValueError),
    ("eps", lambda: ParamNoiseParams(eps=0.0), ValueError),
    ("d_samples", lambda: ParamNoiseParams(d_samples=0), ValueError),
    ("every", lambda: TrainSchedule(every=0), ValueError),
    ("dense_until", lambda: TrainSchedule(dense_until=-1), ValueError),
    ("fit", lambda: TrainSchedule(fit={"steps": 1}), TypeError),
    ("persist", lambda: TrainSchedule(persist=1), TypeError),  # type: ignore[arg-type]
    ("arm_features", lambda: RofuPolicy(net_config(), arm_features=FEATURES), ValueError),
    ("arm_features", lambda: Greedy(net_config(features=True)), ValueError),
    (
        "arm_features",
        lambda: NeuralLinear(net_config(features=True), arm_features=torch.randn(A, F + 1)),
        ValueError,
    ),
]


@pytest.mark.parametrize(
    ("argument", "build", "error"),
    BAD_HYPERPARAMETERS,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_HYPERPARAMETERS)],
)
def test_policy_rejects_bad_hyperparameters_naming_them(argument, build, error):
    with pytest.raises(error, match=rf"^{argument} "):
        build()


def test_rofu_decide_is_the_one_rule_of_the_service_and_the_policy() -> None:
    from rofu.models.policies.base import rofu_decide

    mask = torch.tensor([[True, True, False, True], [False, True, True, False]])
    cold = rofu_decide(None, mask, torch.Generator().manual_seed(0))
    assert cold.propensity.tolist() == [1 / 3, 1 / 2]
    assert all(bool(mask[row, arm]) for row, arm in enumerate(cold.arms.tolist()))
    scores = Scores(
        torch.tensor([[0.9, 0.1, 5.0, 0.2], [0.0, 0.3, 0.2, 0.0]], dtype=torch.float64),
        torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.0]], dtype=torch.float64),
    )
    explore = rofu_decide(scores, mask, torch.Generator(), explore=torch.tensor([True, False]))
    assert explore.arms.tolist() == [1, 1]  # the ucb's argmax; the mean's without exploring
    assert explore.propensity.tolist() == [1.0, 1.0]
    policy = RofuPolicy(net_config(), FAST, FAST_ROFU, seed=3)
    first = policy.select(torch.randn(2, D), mask)
    again = rofu_decide(None, mask, torch.Generator().manual_seed(3))
    assert first.arms.tolist() == again.arms.tolist()  # its cold start is the same rule
    assert first.propensity.tolist() == again.propensity.tolist()


def test_a_windowed_schedule_trains_on_the_last_rows_and_keeps_refitting() -> None:
    schedule = TrainSchedule(every=2, fit=FAST_FIT, window=6)
    policy = RofuPolicy(net_config(), schedule, FAST_ROFU, seed=0)
    x, arms, rewards = torch.randn(20, D), torch.arange(20) % A, torch.arange(20.0)
    trained = [
        policy.update(Transitions(x[i : i + 1], arms[i : i + 1], rewards[i : i + 1]))["trained"]
        for i in range(20)
    ]
    assert trained == [0.0, 1.0] * 10  # every second row, long after the window filled
    assert policy.buffer.view().rewards.tolist() == list(range(14, 20))
    data = policy.buffer.regulariser_data(A)
    assert (data.n_total, data.arm_counts.tolist()) == (6, [1, 1, 2, 2])
