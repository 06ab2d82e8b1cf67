"""ROFU's ascent stability (rofu.models.rofu_stability): rho = step x the regulariser's largest
curvature equals the one computed from explicit per-row Jacobians (an MLP, a CNN); the cap
cuts the step to exactly rho = cap and leaves it alone within the cap; past rho = 2 the
uncapped NTK ascent amplifies the bonus and the capped one does not; every path that
scores a checkpoint (rofu_scores, the replay policy, the service) runs the resolved step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.func import functional_call, jacrev

from rofu.models import RewardNetConfig, RofuConfig, Transitions, rofu_scores
from rofu.models.policies import RofuPolicy
from rofu.models.rofu import checkpoint_config
from rofu.models.rofu_config import minibatch_indices
from rofu.models.rofu_stability import (
    CURVATURE_SEED,
    ascent_stiffness,
    largest_eigenvalue,
    resolve_step,
)
from tests.factories import IMAGE, make_conv_net, make_data, make_net


def _theta(net):
    return {name: p.detach() for name, p in net.named_parameters()}


def _explicit_stiffness(net, data, config):
    """rho from each minibatch's explicit Jacobian J (m, P): kappa * 2 lambda_max(J J^T) / m
    (+ 2 l2), the minibatches drawn as `ascent_stiffness` draws them."""
    theta = _theta(net)
    sample = data.sample
    steps = minibatch_indices(len(sample), config, torch.Generator().manual_seed(CURVATURE_SEED))
    batches = [torch.arange(len(sample))] if steps is None else list(steps)

    def value(params, x, arm):
        return functional_call(net, params, (x[None], arm[None]))[0]

    net.eval()
    largest = 0.0
    for rows in batches:
        x, arms = sample.x[rows], sample.arms[rows]
        jac = torch.vmap(jacrev(value), in_dims=(None, 0, 0))(theta, x, arms)
        flat = torch.cat([jac[name].flatten(1) for name in theta], dim=1)  # (m, P)
        eig = torch.linalg.eigvalsh(flat @ flat.T).max()
        largest = max(largest, 2.0 * float(eig) / len(rows))
    return config.step_size * (largest + 2.0 * config.l2)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("minibatches", {"minibatch_size": 32}),
        ("whole sample", {"minibatch_size": None}),
        ("l2", {"minibatch_size": 32, "l2": 0.3}),
    ],
)
def test_stiffness_equals_the_explicit_jacobians_on_an_mlp(name, kwargs):
    net = make_net(hidden=(16, 16))
    data = make_data(120, 6, 4)
    config = RofuConfig(step_size=0.05, **kwargs)
    rho = ascent_stiffness(net, data, config, _theta(net))
    assert rho > 0
    assert rho == pytest.approx(_explicit_stiffness(net, data, config), rel=1e-3)


def test_stiffness_equals_the_explicit_jacobians_on_a_cnn_with_batch_norm():
    net = make_conv_net()
    data = make_data(40, IMAGE, 4)
    config = RofuConfig(step_size=0.05, minibatch_size=16, steps=3)
    net.train()  # the estimate runs in eval mode and restores the caller's
    rho = ascent_stiffness(net, data, config, _theta(net))
    assert net.training
    assert rho == pytest.approx(_explicit_stiffness(net, data, config), rel=1e-3)


def test_the_trace_bound_answers_within_the_cap_and_the_kernels_beyond_it():
    net, data = make_net(hidden=(16,)), make_data(120, 6, 4)
    theta, config = _theta(net), RofuConfig(step_size=0.05, minibatch_size=32)
    rho = ascent_stiffness(net, data, config, theta)
    bound = ascent_stiffness(net, data, config, theta, within=1e9)
    assert rho < bound  # lambda_max(K) <= trace(K)
    assert ascent_stiffness(net, data, config, theta, within=0.5 * bound) == rho
    cut = resolve_step(net, data, dataclasses.replace(config, stability_cap=bound), theta)
    assert cut.step_size == config.step_size  # the bound is within the cap: no cut
    between = 0.5 * (rho + bound)
    cut = resolve_step(net, data, dataclasses.replace(config, stability_cap=between), theta)
    assert cut.step_size == config.step_size  # rho itself is within it: no cut either


def test_power_iteration_finds_the_largest_eigenvalue_of_each_block():
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(3, 50, 20, generator=gen, dtype=torch.float64)
    rows[1] += 2.0  # a block with a dominant common direction, the largest
    kernels = rows @ rows.transpose(1, 2)
    expected = float(torch.linalg.eigvalsh(kernels).max())
    assert largest_eigenvalue(kernels) == pytest.approx(expected, rel=1e-3)
    assert largest_eigenvalue(torch.zeros(2, 5, 5, dtype=torch.float64)) == 0.0


def test_stiffness_is_zero_without_data_or_steps():
    net = make_net()
    empty = make_data(4, 6, 4)
    empty = dataclasses.replace(
        empty,
        sample=Transitions(empty.sample.x[:0], empty.sample.arms[:0], empty.sample.rewards[:0]),
    )
    assert ascent_stiffness(net, empty, RofuConfig(), _theta(net)) == 0.0
    assert ascent_stiffness(net, make_data(50, 6, 4), RofuConfig(steps=0), _theta(net)) == 0.0


def test_stiffness_grows_with_the_square_of_the_output_scale():
    """rho grows as the gradients do: scaling the last layer by s = 10 scales the first
    layer's gradients by s and leaves the last layer's, so rho grows by between 1 and s^2:
    a network whose outputs grew (large rewards) is stiffer."""
    net, data, config = make_net(hidden=(16,)), make_data(120, 6, 4), RofuConfig(step_size=0.05)
    before = ascent_stiffness(net, data, config, _theta(net))
    with torch.no_grad():
        net.layers[-1].weight.mul_(10.0)
        net.layers[-1].bias.mul_(10.0)
    after = ascent_stiffness(net, data, config, _theta(net))
    assert 5.0 * before < after < 100.0 * before


def test_resolve_step_cuts_to_the_cap_and_leaves_a_stable_step_alone():
    net, data = make_net(hidden=(16,)), make_data(120, 6, 4)
    theta = _theta(net)
    plain = RofuConfig(step_size=0.5, minibatch_size=32)
    rho = ascent_stiffness(net, data, plain, theta)
    assert rho > 0.2
    assert resolve_step(net, data, plain, theta) is plain  # no cap: the config itself

    cut = resolve_step(net, data, dataclasses.replace(plain, stability_cap=0.2), theta)
    assert cut.stability_cap is None
    assert cut.step_size == pytest.approx(0.5 * 0.2 / rho)
    assert ascent_stiffness(net, data, cut, theta) == pytest.approx(0.2, rel=1e-9)
    assert resolve_step(net, data, cut, theta) is cut  # resolved once: nothing left to do

    within = resolve_step(net, data, dataclasses.replace(plain, stability_cap=2 * rho), theta)
    assert within == plain  # the same step, the cap spent


def _unstable_case():
    """A model linear in its parameters whose rows share a direction (contexts around 1, as
    a network's gradient rows do), with a step that runs the ascent at rho about 10."""
    net = make_net(hidden=())
    data = make_data(200, 6, 4, n_total=900)
    with torch.no_grad():
        data.sample.x.add_(1.0)
    gen = torch.Generator().manual_seed(2)
    contexts = 1.0 + torch.randn(4, 6, generator=gen, dtype=torch.float64)
    config = RofuConfig(step_size=1.0, minibatch_size=32, baseline="drift")
    return net, data, contexts, config


def test_past_rho_two_the_uncapped_ascent_amplifies_the_bonus_and_the_capped_does_not():
    net, data, contexts, config = _unstable_case()
    rho = ascent_stiffness(net, data, config, _theta(net))
    assert rho > 8.0, "the case must be unstable"
    capped = dataclasses.replace(config, stability_cap=1.0)
    resolved = checkpoint_config(net, data, capped)
    gen = torch.Generator
    loose = rofu_scores(net, contexts, data, config, gen().manual_seed(4)).bonus
    tight = rofu_scores(net, contexts, data, resolved, gen().manual_seed(4)).bonus
    # The gain (bonus^2) per push kappa s |g_q|^2 (s = 1 / (eta |D|), g_q = (x, 1) in the
    # arm's block): with a monotone descent (rho <= 1) each of the M steps adds at most
    # one push; past rho = 2 each multiplies what is there by up to rho - 1.
    push = data.n_total**-1.0 * (contexts.square().sum(dim=1) + 1.0)[:, None]  # (B, 1)
    assert float((tight.square() / (resolved.step_size * push)).max()) <= config.steps + 1e-9
    assert float((loose.square() / (config.step_size * push)).max()) > 20.0 * config.steps


@pytest.mark.parametrize("estimator", ["exact", "ntk"])
def test_rofu_scores_with_a_cap_equal_the_resolved_config(estimator):
    net = make_net(hidden=(16,))
    data = make_data(150, 6, 4)
    contexts = torch.randn(3, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    config = RofuConfig(step_size=0.5, minibatch_size=32, estimator=estimator, stability_cap=0.3)
    resolved = checkpoint_config(net, data, config)
    assert resolved.step_size < config.step_size
    capped = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(1))
    direct = rofu_scores(net, contexts, data, resolved, torch.Generator().manual_seed(1))
    torch.testing.assert_close(capped.bonus, direct.bonus, rtol=0, atol=0)
    uncapped = dataclasses.replace(config, stability_cap=None)
    plain = rofu_scores(net, contexts, data, uncapped, torch.Generator().manual_seed(1))
    assert not torch.equal(plain.bonus, capped.bonus)


def test_ntk_equals_exact_with_a_cap_on_a_model_linear_in_its_parameters():
    net, data, contexts, config = _unstable_case()
    capped = dataclasses.replace(config, stability_cap=1.0)
    exact = rofu_scores(net, contexts, data, capped, torch.Generator().manual_seed(4))
    ntk = rofu_scores(
        net,
        contexts,
        data,
        dataclasses.replace(capped, estimator="ntk"),
        torch.Generator().manual_seed(4),
    )
    torch.testing.assert_close(ntk.bonus, exact.bonus, rtol=1e-9, atol=1e-12)


def test_rofu_policy_resolves_the_step_once_per_refit_with_its_weights():
    config = RofuConfig(step_size=0.5, minibatch_size=16, estimator="ntk", stability_cap=0.1)
    policy = RofuPolicy(RewardNetConfig(context_dim=6, n_arms=4, hidden=(16,)), params=config)
    data = make_data(64, 6, 4, dtype=torch.float32)
    policy.update(data.sample)
    contexts = torch.randn(2, 6, generator=torch.Generator().manual_seed(9))
    policy.select(contexts)
    step = policy.scoring_step  # what the policy scored with
    expected = checkpoint_config(policy.net, policy.buffer.regulariser_data(4), config)
    assert step == pytest.approx(expected.step_size, rel=1e-6)
    assert step < config.step_size
    policy.update(make_data(64, 6, 4, seed=1, dtype=torch.float32).sample)  # a refit
    assert policy.scoring_step is None  # resolved again for the new weights
