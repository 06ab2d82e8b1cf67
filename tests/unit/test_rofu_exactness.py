"""ROFU's numerical promises: batched == naive loop, LinUCB and UCB1 as special cases,
and the bonus's monotonicity."""

from __future__ import annotations

import math

import pytest
import torch

from rofu.models import RegulariserData, RofuConfig, Transitions, rofu_scores
from rofu.models.policies import LinUCB
from rofu.models.rofu_naive import rofu_scores_naive
from tests.factories import arm_features, make_data, make_net, make_transitions

CASES = [
    # (description, network kwargs, rofu config kwargs)
    ("dataset form", {}, {"regulariser": "dataset"}),
    ("arm_count form with l2", {}, {"regulariser": "arm_count", "l2": 0.3}),
    ("step decay, tanh", {"activation": "tanh"}, {"step_decay": 0.7, "steps": 6}),
    ("chunked pairs", {}, {"chunk_size": 3}),
    ("whole sample, no minibatch", {"hidden": (8,)}, {"minibatch_size": None}),
    ("bonus scale and eta", {}, {"bonus_scale": 2.5, "eta": 0.2}),
    ("drift baseline", {}, {"baseline": "drift"}),
    (
        "drift baseline, arm_count with l2",
        {},
        {"baseline": "drift", "regulariser": "arm_count", "l2": 0.3},
    ),
]


def _naive_vs_batched(net, contexts, data, config, *, candidates=None, features=None):
    batched = rofu_scores(
        net,
        contexts,
        data,
        config,
        torch.Generator().manual_seed(7),
        candidates=candidates,
        arm_features=features,
    )
    naive = rofu_scores_naive(
        net,
        contexts,
        data,
        config,
        torch.Generator().manual_seed(7),
        candidates=candidates,
        arm_features=features,
    )
    return batched, naive


@pytest.mark.parametrize(("name", "net_kwargs", "rofu_kwargs"), CASES, ids=[c[0] for c in CASES])
def test_rofu_batched_equals_naive_loop_float64(name, net_kwargs, rofu_kwargs):
    net = make_net(**net_kwargs)
    data = make_data(200, 6, 4, n_total=900)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    config = RofuConfig(**{"step_size": 0.05, "minibatch_size": 32, **rofu_kwargs})
    batched, naive = _naive_vs_batched(net, contexts, data, config)
    assert bool((batched.bonus > 0).any()), "the case must exercise a non-zero bonus"
    torch.testing.assert_close(batched.mean, naive.mean, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(batched.bonus, naive.bonus, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(batched.ucb, naive.ucb, rtol=1e-5, atol=1e-9)


def test_rofu_batched_equals_naive_loop_float32():
    net = make_net(dtype=torch.float32, hidden=(32, 32))
    data = make_data(300, 6, 4, dtype=torch.float32)
    contexts = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    config = RofuConfig(step_size=0.02, minibatch_size=64)
    batched, naive = _naive_vs_batched(net, contexts, data, config)
    torch.testing.assert_close(batched.ucb, naive.ucb, rtol=1e-5, atol=1e-6)


def test_rofu_batched_equals_naive_loop_with_candidates_and_arm_features():
    features = arm_features(5, 3)
    net = make_net(arm_feature_dim=3, hidden=(16,))
    data = make_data(120, 6, 5)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    candidates = torch.tensor([[True, False, True, True, False], [False] * 4 + [True], [True] * 5])
    config = RofuConfig(step_size=0.05, minibatch_size=40, regulariser="arm_count")
    batched, naive = _naive_vs_batched(
        net, contexts, data, config, candidates=candidates, features=features
    )
    assert bool(batched.ucb.isnan().eq(~candidates).all()), "non-candidates are NaN"
    torch.testing.assert_close(batched.ucb, naive.ucb, rtol=1e-5, atol=1e-9, equal_nan=True)


def _ridge(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """theta = (I + X^T X)^{-1} X^T r and (I + X^T X)^{-1}."""
    z_inv = torch.linalg.inv(torch.eye(x.shape[1], dtype=x.dtype) + x.T @ x)
    return z_inv @ x.T @ r, z_inv


def _converging_config(gram_max: float, n_total: int, **kwargs) -> RofuConfig:
    # In normalised units the loss Hessian is (2 / |D|) (I + X^T X); step 1 / L converges.
    return RofuConfig(
        steps=3000, step_size=n_total / (2.0 * gram_max), minibatch_size=None, **kwargs
    )


def test_rofu_linear_per_arm_model_equals_linucb():
    n_arms, dim = 3, 4
    data = make_data(60, dim, n_arms, seed=2)
    x, arms, r = data.sample.x, data.sample.arms, data.sample.rewards
    net = make_net(dim, n_arms, hidden=(), bias=False)
    linucb = LinUCB(dim, n_arms, alpha=1.0, ridge=1.0)
    linucb.update(data.sample)
    gram_max = 0.0
    with torch.no_grad():
        for a in range(n_arms):
            theta, _ = _ridge(x[arms == a], r[arms == a])
            net.layers[0].weight[a] = theta
            gram_max = max(
                gram_max,
                float(
                    torch.linalg.eigvalsh(
                        torch.eye(dim, dtype=x.dtype) + x[arms == a].T @ x[arms == a]
                    ).max()
                ),
            )
    config = _converging_config(gram_max, 60, eta=0.5, l2=1.0)
    contexts = torch.randn(5, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = rofu_scores(net, contexts, data, config, torch.Generator())
    want = linucb.scores(contexts)
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(got.bonus, want.bonus, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(got.ucb, want.ucb, rtol=1e-4, atol=1e-10)


def test_rofu_linear_arm_feature_model_equals_closed_form_linucb():
    dim, feat, n_arms = 3, 2, 4
    features = arm_features(n_arms, feat, seed=4)
    data = make_data(50, dim, n_arms, seed=5)
    phi = torch.cat([data.sample.x, features[data.sample.arms]], dim=1)  # (N, D+F)
    theta, z_inv = _ridge(phi, data.sample.rewards)
    net = make_net(dim, hidden=(), bias=False, arm_feature_dim=feat)
    with torch.no_grad():
        net.layers[0].weight[0] = theta
    gram_max = float(torch.linalg.eigvalsh(torch.eye(dim + feat).double() + phi.T @ phi).max())
    config = _converging_config(gram_max, 50, eta=0.5, l2=1.0)
    contexts = torch.randn(3, dim, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    got = rofu_scores(net, contexts, data, config, torch.Generator(), arm_features=features)
    query = torch.cat(
        [contexts.repeat_interleave(n_arms, 0), features.repeat(3, 1)], dim=1
    )  # (B*A, D+F)
    want_mean = (query @ theta).view(3, n_arms)
    want_bonus = torch.einsum("pi,ij,pj->p", query, z_inv, query).sqrt().view(3, n_arms)
    torch.testing.assert_close(got.mean, want_mean, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(got.bonus, want_bonus, rtol=1e-4, atol=1e-10)


def test_rofu_per_arm_means_give_the_ucb1_bonus():
    pulls = torch.tensor([3, 10, 40])  # n_a
    arms = torch.repeat_interleave(torch.arange(3), pulls)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(len(arms), generator=gen, dtype=torch.float64)
    sample = Transitions(torch.ones(len(arms), 1, dtype=torch.float64), arms, rewards)
    n_total = len(arms)
    data = RegulariserData(sample, n_total, pulls)
    net = make_net(1, 3, hidden=(), bias=False)  # f(x=1, a) = theta_a
    with torch.no_grad():
        for a in range(3):
            net.layers[0].weight[a, 0] = rewards[arms == a].mean()  # theta_{t-1}: empirical means
    eta = 1.0 / (16.0 * math.log(n_total))  # paper, appendix Thm (b = 1/2)
    config = RofuConfig(steps=3000, step_size=n_total / (2.0 * 40), minibatch_size=None, eta=eta)
    got = rofu_scores(net, torch.ones(1, 1, dtype=torch.float64), data, config, torch.Generator())
    want = torch.sqrt(8.0 * math.log(n_total) / pulls.double())
    torch.testing.assert_close(got.bonus[0], want, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(got.mean[0], net.layers[0].weight[:, 0].detach())


def test_rofu_bonus_is_never_negative():
    for seed in range(8):
        net = make_net(seed=seed, hidden=(12,))
        data = make_data(80, 6, 4, seed=seed)
        contexts = torch.randn(6, 6, generator=torch.Generator().manual_seed(seed)).double()
        config = RofuConfig(step_size=0.5, minibatch_size=16, steps=seed % 4 + 1)
        scores = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(seed))
        assert bool((scores.bonus >= 0).all())
        assert bool(torch.isfinite(scores.ucb).all())


def _trained_mlp_and_data() -> tuple:
    from rofu.models import FitConfig, fit

    net = make_net(hidden=(16,), seed=3)
    sample = make_transitions(120, 6, 4, seed=3)
    fit(
        net, sample, FitConfig(steps=400, batch_size=120, lr=0.01), torch.Generator().manual_seed(0)
    )
    data = RegulariserData(sample, len(sample), torch.bincount(sample.arms, minlength=4))
    return net, data


def test_rofu_bonus_grows_with_steps():
    net, data = _trained_mlp_and_data()
    contexts = torch.randn(5, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    bonuses = [
        rofu_scores(
            net,
            contexts,
            data,
            RofuConfig(steps=m, step_size=0.01, minibatch_size=None),
            torch.Generator(),
        ).bonus
        for m in (0, 1, 3, 10, 30)
    ]
    assert bool((bonuses[0] == 0).all())
    for fewer, more in zip(bonuses, bonuses[1:], strict=False):
        assert bool((more >= fewer - 1e-12).all()), "every pair's bonus grows with M"
    assert bool((bonuses[-1] > bonuses[1]).all())


def test_rofu_bonus_shrinks_as_an_arms_data_grows_linear_model():
    dim = 3
    contexts = torch.randn(4, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    bonuses = []
    for n in (5, 20, 80, 320):
        sample = make_transitions(n, dim, 1, seed=n)
        theta, z_inv = _ridge(sample.x, sample.rewards)
        net = make_net(dim, 1, hidden=(), bias=False)
        with torch.no_grad():
            net.layers[0].weight[0] = theta
        gram_max = float(torch.linalg.eigvalsh(torch.linalg.inv(z_inv)).max())
        config = _converging_config(gram_max, n, eta=0.5, l2=1.0)
        data = RegulariserData(sample, n, torch.tensor([n]))
        bonuses.append(rofu_scores(net, contexts, data, config, torch.Generator()).bonus[:, 0])
    for smaller_data, larger_data in zip(bonuses, bonuses[1:], strict=False):
        assert bool((larger_data < smaller_data).all())


def test_rofu_bonus_shrinks_as_an_arms_pull_count_grows_mlp():
    net, data = _trained_mlp_and_data()
    contexts = torch.randn(5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    config = RofuConfig(steps=5, step_size=0.05, minibatch_size=None, regulariser="arm_count")
    bonuses = []
    for pulls in (40, 400, 4000):
        counts = data.arm_counts.clone()
        counts[0] = pulls
        grown = RegulariserData(data.sample, int(counts.sum()), counts)
        bonuses.append(rofu_scores(net, contexts, grown, config, torch.Generator()).bonus[:, 0])
    assert bool((bonuses[1] < bonuses[0]).all())
    assert bool((bonuses[2] < bonuses[1]).all())


def test_rofu_drift_baseline_equals_start_at_a_minimiser_of_r():
    """With theta_{t-1} = argmin R (linear model, full batch), R's descent does not move f,
    so both baselines give the LinUCB bound."""
    n_arms, dim = 2, 3
    data = make_data(40, dim, n_arms, seed=6)
    x, arms, r = data.sample.x, data.sample.arms, data.sample.rewards
    net = make_net(dim, n_arms, hidden=(), bias=False)
    gram_max = 0.0
    with torch.no_grad():
        for a in range(n_arms):
            theta, _ = _ridge(x[arms == a], r[arms == a])
            net.layers[0].weight[a] = theta
            gram = torch.eye(dim, dtype=x.dtype) + x[arms == a].T @ x[arms == a]
            gram_max = max(gram_max, float(torch.linalg.eigvalsh(gram).max()))
    contexts = torch.randn(4, dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    scores = {
        baseline: rofu_scores(
            net,
            contexts,
            data,
            _converging_config(gram_max, 40, eta=0.5, l2=1.0, baseline=baseline),
            torch.Generator(),
        )
        for baseline in ("start", "drift")
    }
    torch.testing.assert_close(scores["drift"].bonus, scores["start"].bonus, rtol=1e-6, atol=1e-9)


def test_rofu_drift_baseline_removes_r_descent_from_the_bonus():
    """Away from R's minimiser, `start` credits R's own descent to the bonus; with no
    optimism (huge eta) `drift` gives zero bonus while `start` does not."""
    net = make_net(hidden=(16,), seed=8)  # untrained: far from argmin R
    data = make_data(200, 6, 4, seed=8)
    contexts = torch.randn(5, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    common = {"eta": 1e12, "step_size": 0.5, "minibatch_size": 32}
    start = rofu_scores(net, contexts, data, RofuConfig(**common), torch.Generator())
    drift = rofu_scores(
        net, contexts, data, RofuConfig(baseline="drift", **common), torch.Generator()
    )
    assert float(start.bonus.max()) > 0.05
    assert float(drift.bonus.abs().max()) < 1e-6
