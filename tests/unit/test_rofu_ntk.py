"""NTK-ROFU's promises: exact on a model linear in its parameters, equal to explicit ascent
on the linearised objective for an MLP, LinUCB as a special case, and the bonus's shape."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.func import functional_call, grad, jvp

from rofu.models import RegulariserData, RofuConfig, rofu_scores
from rofu.models.networks import ACTIVATION_GRADS, ACTIVATIONS
from rofu.models.rofu import ntk_basis
from rofu.models.rofu_config import minibatch_indices, regulariser_weights
from rofu.models.rofu_ntk import features
from tests.factories import arm_features, make_data, make_net, make_transitions
from tests.unit.test_rofu_exactness import _converging_config, _ridge

#: torch.func.jvp's first call scripts its decompositions with torch.jit, which warns.
JIT_WARNING = "ignore:`torch.jit.script` is deprecated:DeprecationWarning"

LINEAR_CASES = [
    ("dataset, minibatches", {"minibatch_size": 32}),
    ("arm_count with l2", {"minibatch_size": 32, "regulariser": "arm_count", "l2": 0.3}),
    ("whole sample", {"minibatch_size": None}),
    ("drift baseline", {"minibatch_size": 32, "baseline": "drift"}),
    (
        "drift, arm_count with l2, decay",
        {"baseline": "drift", "regulariser": "arm_count", "l2": 0.3, "step_decay": 0.8},
    ),
]


def _both(net, contexts, data, config, *, features_=None, candidates=None):
    exact = rofu_scores(
        net,
        contexts,
        data,
        config,
        torch.Generator().manual_seed(4),
        arm_features=features_,
        candidates=candidates,
    )
    ntk = rofu_scores(
        net,
        contexts,
        data,
        dataclasses.replace(config, estimator="ntk"),
        torch.Generator().manual_seed(4),
        arm_features=features_,
        candidates=candidates,
    )
    return exact, ntk


@pytest.mark.parametrize(("name", "kwargs"), LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
@pytest.mark.parametrize("form", ["per-arm", "arm features"])
def test_ntk_equals_exact_on_a_model_linear_in_its_parameters(name, kwargs, form):
    features_ = arm_features(5, 3) if form == "arm features" else None
    net = make_net(hidden=(), arm_feature_dim=3 if features_ is not None else 0)
    data = make_data(200, 6, 5 if features_ is not None else 4, n_total=900)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    config = RofuConfig(step_size=0.05, **kwargs)
    exact, ntk = _both(net, contexts, data, config, features_=features_)
    assert float(exact.bonus.max()) > 0.01, "the case must exercise a non-zero bonus"
    torch.testing.assert_close(ntk.mean, exact.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ntk.bonus, exact.bonus, rtol=1e-9, atol=1e-12)


def test_ntk_differs_from_exact_on_an_mlp():
    """The linearisation is exact only for a linear model: on an MLP they differ a little."""
    net = make_net(hidden=(16, 16))
    data = make_data(200, 6, 4)
    contexts = torch.randn(4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact, ntk = _both(net, contexts, data, RofuConfig(step_size=0.5, minibatch_size=32))
    gap = (ntk.bonus - exact.bonus).abs().max()
    assert 1e-8 < float(gap) < 0.5 * float(exact.bonus.max())


def _linearised_ascent(net, contexts, data, config, generator, features_=None):
    """The definition: per pair, M explicit gradient steps on the first-order expansion of f
    around theta (torch.func.jvp), for the regulariser and the optimism term alike."""
    theta = {k: v.detach() for k, v in net.named_parameters()}
    steps = minibatch_indices(len(data.sample), config, generator)
    n_arms = net.arm_count(features_)

    def f(params, x, arms):
        return functional_call(net, params, (x, arms, features_))

    def linear(delta, x, arms):
        value, change = jvp(lambda p: f(p, x, arms), (theta,), (delta,))
        return value + change

    def loss(delta, x, arm, step, weight, push):
        sample = data.sample if steps is None else data.sample.subset(steps[step])
        mse = (linear(delta, sample.x, sample.arms) - sample.rewards).square().mean()
        l2 = sum((theta[k] + delta[k]).square().sum() for k in theta) * config.l2 / weight
        optimism = linear(delta, x[None], arm[None])[0] / (config.eta * weight)
        return mse + l2 - (optimism if push else 0.0)

    bonus = torch.zeros(len(contexts), n_arms, dtype=torch.float64)
    weights = regulariser_weights(data, torch.arange(n_arms), config)
    for b, x in enumerate(contexts):
        for a in range(n_arms):
            arm, weight = torch.tensor(a), float(weights[a])
            ends = {}
            for push in (True, False):
                delta = {k: torch.zeros_like(v) for k, v in theta.items()}
                for j in range(config.steps):
                    kappa = config.step_size * config.step_decay**j
                    g = grad(loss)(delta, x, arm, j, weight, push)
                    delta = {k: delta[k] - kappa * g[k] for k in delta}
                ends[push] = linear(delta, x[None], arm[None])[0]
            base = f(theta, x[None], arm[None])[0] if config.baseline == "start" else ends[False]
            bonus[b, a] = config.bonus_scale * (ends[True] - base).clamp(min=0).sqrt()
    return bonus


MLP_CASES = [
    ("start, dataset", {}, {}),
    ("drift, arm_count, l2", {}, {"baseline": "drift", "regulariser": "arm_count", "l2": 0.2}),
    ("tanh, no bias, decay", {"activation": "tanh", "bias": False}, {"step_decay": 0.7}),
    ("gelu, whole sample", {"activation": "gelu"}, {"minibatch_size": None}),
    ("elu", {"activation": "elu"}, {"eta": 0.3}),
    ("sigmoid", {"activation": "sigmoid"}, {"bonus_scale": 2.0}),
]


@pytest.mark.filterwarnings(JIT_WARNING)
@pytest.mark.parametrize(
    ("name", "net_kwargs", "rofu_kwargs"), MLP_CASES, ids=[c[0] for c in MLP_CASES]
)
def test_ntk_equals_explicit_ascent_on_the_linearised_objective(name, net_kwargs, rofu_kwargs):
    net = make_net(hidden=(8, 8), **net_kwargs)
    data = make_data(60, 6, 4, n_total=300)
    contexts = torch.randn(2, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    config = RofuConfig(
        **{"step_size": 0.3, "minibatch_size": 16, "steps": 4, "estimator": "ntk", **rofu_kwargs}
    )
    got = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(1))
    want = _linearised_ascent(net, contexts, data, config, torch.Generator().manual_seed(1))
    assert float(want.max()) > 1e-3
    torch.testing.assert_close(got.bonus, want, rtol=1e-8, atol=1e-10)


@pytest.mark.filterwarnings(JIT_WARNING)
def test_ntk_equals_explicit_ascent_with_arm_features():
    features_ = arm_features(3, 2)
    net = make_net(hidden=(8,), arm_feature_dim=2)
    data = make_data(50, 6, 3)
    contexts = torch.randn(2, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    config = RofuConfig(step_size=0.3, minibatch_size=16, steps=3, estimator="ntk")
    got = rofu_scores(
        net, contexts, data, config, torch.Generator().manual_seed(1), arm_features=features_
    )
    want = _linearised_ascent(
        net, contexts, data, config, torch.Generator().manual_seed(1), features_
    )
    torch.testing.assert_close(got.bonus, want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("form", ["per-arm", "arm features"])
def test_rank_one_kernel_equals_explicit_gradient_products(activation, form):
    features_ = arm_features(4, 3) if form == "arm features" else None
    dim = 0 if features_ is None else 3
    net = make_net(hidden=(7, 5), activation=activation, arm_feature_dim=dim)
    theta = {k: v.detach() for k, v in net.named_parameters()}
    rows = make_transitions(9, 6, 4, seed=1)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    owner = torch.tensor([0, 0, 1, 2, 2])
    arms = torch.tensor([0, 3, 1, 2, 0])
    got = features(net, theta, rows.x, rows.arms, features_)
    query = features(net, theta, contexts, arms, features_, owner)

    class Wrapped(torch.nn.Module):  # not a RewardNet: takes the explicit path
        def __init__(self) -> None:
            super().__init__()
            self.inner = net

        def forward(self, x, a, z=None):
            return self.inner(x, a, z)

    wrapped = {f"inner.{k}": v for k, v in theta.items()}
    explicit = features(Wrapped(), wrapped, rows.x, rows.arms, features_)
    explicit_query = features(Wrapped(), wrapped, contexts, arms, features_, owner)
    torch.testing.assert_close(got.kernel(query), explicit.kernel(explicit_query))
    torch.testing.assert_close(got.kernel(got), explicit.kernel(explicit))
    torch.testing.assert_close(query.square_norm(), explicit_query.square_norm())
    torch.testing.assert_close(query.theta_dot, explicit_query.theta_dot)
    torch.testing.assert_close(query.value, explicit_query.value)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_activation_gradients_match_autograd(activation):
    z = torch.linspace(-3, 3, 41, dtype=torch.float64).requires_grad_()
    h = ACTIVATIONS[activation](z)
    (want,) = torch.autograd.grad(h.sum(), z)
    got = ACTIVATION_GRADS[activation](z.detach(), h.detach())
    torch.testing.assert_close(got, want)


def test_ntk_linear_per_arm_model_equals_linucb():
    """R = |theta|^2 + |D| MSE, eta = 1/2, converged: NTK-ROFU is LinUCB (paper Thm 1)."""
    from rofu.models.policies import LinUCB

    n_arms, dim = 3, 4
    data = make_data(60, dim, n_arms, seed=2)
    x, arms, r = data.sample.x, data.sample.arms, data.sample.rewards
    net = make_net(dim, n_arms, hidden=(), bias=False)
    gram_max = 0.0
    with torch.no_grad():
        for a in range(n_arms):
            theta, _ = _ridge(x[arms == a], r[arms == a])
            net.layers[0].weight[a] = theta
            gram = torch.eye(dim, dtype=x.dtype) + x[arms == a].T @ x[arms == a]
            gram_max = max(gram_max, float(torch.linalg.eigvalsh(gram).max()))
    linucb = LinUCB(dim, n_arms, alpha=1.0, ridge=1.0)
    linucb.update(data.sample)
    config = _converging_config(gram_max, 60, eta=0.5, l2=1.0, estimator="ntk")
    contexts = torch.randn(5, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = rofu_scores(net, contexts, data, config, torch.Generator())
    want = linucb.scores(contexts)
    torch.testing.assert_close(got.mean, want.mean, rtol=1e-4, atol=1e-10)
    torch.testing.assert_close(got.bonus, want.bonus, rtol=1e-4, atol=1e-10)


@pytest.mark.parametrize("baseline", ["start", "drift"])
def test_ntk_bonus_is_never_negative_and_grows_with_steps(baseline):
    net = make_net(hidden=(12,), seed=3)
    data = make_data(80, 6, 4, seed=3)
    contexts = torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    bonuses = []
    for steps in (0, 1, 3, 10, 30):
        config = RofuConfig(
            steps=steps, step_size=0.01, minibatch_size=None, baseline=baseline, estimator="ntk"
        )
        scores = rofu_scores(net, contexts, data, config, torch.Generator())
        assert bool((scores.bonus >= 0).all())
        bonuses.append(scores.bonus)
    assert bool((bonuses[0] == 0).all())
    if baseline == "drift":  # the gain is pure optimism: it grows with M for every pair
        for fewer, more in zip(bonuses, bonuses[1:], strict=False):
            assert bool((more >= fewer - 1e-12).all())
        assert bool((bonuses[-1] > bonuses[1]).all())
    else:  # R's own descent can cancel the optimism (the `start` baseline's known flaw)
        assert float(bonuses[-1].max()) > float(bonuses[1].max())


def test_ntk_bonus_shrinks_as_an_arms_pull_count_grows():
    net = make_net(hidden=(16,), seed=3)
    sample = make_transitions(120, 6, 4, seed=3)
    contexts = torch.randn(5, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    config = RofuConfig(
        steps=5, step_size=0.05, minibatch_size=None, regulariser="arm_count", estimator="ntk"
    )
    bonuses = []
    for pulls in (40, 400, 4000):
        counts = torch.bincount(sample.arms, minlength=4)
        counts[0] = pulls
        data = RegulariserData(sample, int(counts.sum()), counts)
        bonuses.append(rofu_scores(net, contexts, data, config, torch.Generator()).bonus[:, 0])
    assert bool((bonuses[1] < bonuses[0]).all())
    assert bool((bonuses[2] < bonuses[1]).all())


def test_ntk_prepared_basis_gives_the_same_scores_as_one_built_per_call():
    net = make_net(hidden=(16,))
    data = make_data(200, 6, 4, n_total=1000)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    config = RofuConfig(minibatch_size=32, estimator="ntk", regulariser="arm_count")
    basis = ntk_basis(net, data, config, torch.Generator().manual_seed(9))
    candidates = torch.tensor([[True, False, True, True], [True] * 4, [False, True, False, False]])
    prepared = rofu_scores(
        net, contexts, data, config, torch.Generator(), basis=basis, candidates=candidates
    )
    fresh = rofu_scores(
        net, contexts, data, config, torch.Generator().manual_seed(9), candidates=candidates
    )
    torch.testing.assert_close(prepared.ucb, fresh.ucb, equal_nan=True)
    assert bool(prepared.ucb.isnan().eq(~candidates).all())


@pytest.mark.parametrize("owner", ["every arm of each context", "irregular"])
def test_query_kernel_is_the_same_read_in_groups_or_gathered(owner):
    """Queries whose contexts each hold the same run of arms take the broadcast path; it
    must equal the kernel of the same points built one row per point (no owner)."""
    net = make_net(hidden=(8, 5))
    theta = {name: p.detach() for name, p in net.named_parameters()}
    contexts = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if owner == "irregular":
        points = torch.tensor([0, 0, 1, 2, 2, 2])
        arms = torch.tensor([0, 3, 1, 0, 1, 2])
    else:
        points = torch.arange(3).repeat_interleave(4)
        arms = torch.arange(4).repeat(3)
    rows = make_transitions(7, 6, 4, seed=2)
    basis_rows = features(net, theta, rows.x, rows.arms, None)
    query = features(net, theta, contexts, arms, None, owner=points)
    assert (query._group() is not None) == (owner != "irregular")
    flat = features(net, theta, contexts[points], arms, None)
    torch.testing.assert_close(query.kernel(basis_rows), flat.kernel(basis_rows))
