"""Closed-form NTK-ROFU's promises: LinUCB for a linear model, the limit of the linearised
ascent on an MLP, and a bonus that is never negative, shrinks with data and knows contexts."""

from __future__ import annotations

import pytest
import torch

from rofu.models import RegulariserData, RofuConfig, Transitions, rofu_scores
from rofu.models.policies import LinUCB
from rofu.models.prepared import prepare, score
from rofu.models.rofu_closed import closed_gains, prepare_closed, span_share
from rofu.models.rofu_config import regulariser_weights
from rofu.models.rofu_kfac import kfac_gains, per_arm_blocks, prepare_kfac
from rofu.models.rofu_ntk import features
from tests.factories import arm_features, make_data, make_net


def _closed(net, contexts, data, config):
    """(B, A) mean and bonus of every arm from the closed form."""
    theta = dict(net.named_parameters())
    basis = prepare_closed(net, theta, data, config, torch.Generator(), None)
    n_contexts, n_arms = contexts.shape[0], net.config.n_arms
    owner = torch.arange(n_contexts).repeat_interleave(n_arms)
    arms = torch.arange(n_arms).repeat(n_contexts)
    query = features(net, theta, contexts, arms, None, owner)
    f0, gain = closed_gains(basis, query, regulariser_weights(data, arms, config), config)
    bonus = config.bonus_scale * gain.clamp_min(0).sqrt()
    return f0.detach().view(n_contexts, n_arms), bonus.detach().view(n_contexts, n_arms)


def _contexts(n, dim, seed=1):
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_rofu_closed_is_linucb_for_a_linear_model():
    n_arms, dim = 3, 4
    data = make_data(60, dim, n_arms, seed=2)
    net = make_net(dim, n_arms, hidden=(), bias=False)
    linucb = LinUCB(dim, n_arms, alpha=1.0, ridge=1.0)
    linucb.update(data.sample)
    with torch.no_grad():
        net.layers[0].weight.copy_(torch.randn(n_arms, dim, dtype=torch.float64))
    contexts = _contexts(5, dim)
    _, bonus = _closed(net, contexts, data, RofuConfig(eta=0.5, l2=1.0, minibatch_size=None))
    torch.testing.assert_close(bonus, linucb.scores(contexts).bonus, rtol=1e-9, atol=1e-12)


def test_rofu_closed_is_the_limit_of_the_linearised_ascent_on_an_mlp():
    net = make_net(hidden=(16, 16))
    data = make_data(120, 6, 4)
    theta = dict(net.named_parameters())
    rows = features(net, theta, data.sample.x, data.sample.arms, None)
    curvature = float(torch.linalg.eigvalsh(rows.kernel(rows).detach()).max()) / len(data.sample)
    l2 = 0.1 * curvature * data.n_total  # lambda' = l2 / |D| a tenth of J^T J / m's top
    steps = RofuConfig(
        estimator="ntk",
        baseline="drift",
        minibatch_size=None,
        l2=l2,
        steps=600,
        step_size=0.9 / (curvature + l2 / data.n_total),
    )
    contexts = _contexts(3, 6)
    ascent = rofu_scores(net, contexts, data, steps, torch.Generator())
    mean, bonus = _closed(net, contexts, data, RofuConfig(l2=l2))
    assert float(bonus.min()) > 1e-3, "the case must exercise a non-zero bonus"
    torch.testing.assert_close(mean, ascent.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bonus, ascent.bonus, rtol=1e-8, atol=1e-12)


def test_rofu_closed_bonus_is_never_negative_and_shrinks_as_data_grows():
    net = make_net(hidden=(8,))
    contexts = _contexts(4, 6, seed=3)
    config = RofuConfig(l2=1.0)
    everything = make_data(640, 6, 4, seed=5).sample
    previous = None
    for n in (10, 40, 160, 640):
        sample = everything.subset(torch.arange(n))
        data = RegulariserData(sample, n, torch.bincount(sample.arms, minlength=4))
        _, bonus = _closed(net, contexts, data, config)
        assert bool((bonus >= 0).all())
        if previous is not None:
            assert bool((bonus < previous).all()), (n, bonus, previous)
        previous = bonus


def test_rofu_closed_bonus_is_larger_for_a_context_unlike_the_arms_data():
    gen = torch.Generator().manual_seed(7)
    centre = torch.tensor([2.0, -1.0, 0.5, 0.0, 1.0, -2.0], dtype=torch.float64)
    x = centre + 0.1 * torch.randn(200, 6, generator=gen, dtype=torch.float64)
    arms = torch.zeros(200, dtype=torch.long)
    rewards = torch.randn(200, generator=gen, dtype=torch.float64)
    data = RegulariserData(Transitions(x, arms, rewards), 200, torch.tensor([200, 0]))
    net = make_net(hidden=(16,), n_arms=2)
    like, unlike = centre[None], -centre[None]
    _, near = _closed(net, like, data, RofuConfig(l2=1.0, regulariser="arm_count"))
    _, far = _closed(net, unlike, data, RofuConfig(l2=1.0, regulariser="arm_count"))
    assert float(far[0, 0]) > 2.0 * float(near[0, 0])


def test_rofu_closed_needs_a_positive_l2():
    net = make_net(hidden=(4,))
    data = make_data(20, 6, 4)
    with pytest.raises(ValueError, match="l2 must be > 0"):
        prepare_closed(
            net, dict(net.named_parameters()), data, RofuConfig(l2=0.0), torch.Generator(), None
        )


def test_rofu_closed_span_share_is_one_for_a_sample_row_and_less_outside():
    net = make_net(hidden=(32, 32))  # P far above the 30 rows
    data = make_data(30, 6, 4, seed=9)
    theta = dict(net.named_parameters())
    basis = prepare_closed(net, theta, data, RofuConfig(l2=1.0), torch.Generator(), None)
    own = features(net, theta, data.sample.x[:3], data.sample.arms[:3], None)
    fresh = features(net, theta, _contexts(3, 6, seed=11), torch.tensor([0, 1, 2]), None)
    torch.testing.assert_close(span_share(basis, own), torch.ones(3, dtype=torch.float64))
    assert bool((span_share(basis, fresh) < 0.9).all())


def _kfac(net, contexts, data, config):
    theta = dict(net.named_parameters())
    factors = prepare_kfac(net, theta, data, config, torch.Generator(), None)
    n_contexts, n_arms = contexts.shape[0], net.config.n_arms
    owner = torch.arange(n_contexts).repeat_interleave(n_arms)
    arms = torch.arange(n_arms).repeat(n_contexts)
    query = features(net, theta, contexts, arms, None, owner)
    weight = regulariser_weights(data, arms, config)
    _, gain = kfac_gains(factors, query, arms, weight, config)
    return (config.bonus_scale * gain.clamp_min(0).sqrt()).detach().view(n_contexts, n_arms)


@pytest.mark.parametrize("regulariser", ["dataset", "arm_count"])
def test_rofu_kfac_is_exact_for_a_linear_model(regulariser):
    net = make_net(4, 3, hidden=(), bias=True)
    data = make_data(80, 4, 3, seed=4, n_total=300)
    config = RofuConfig(l2=0.7, regulariser=regulariser)
    contexts = _contexts(5, 4, seed=6)
    torch.testing.assert_close(
        _kfac(net, contexts, data, config),
        _closed(net, contexts, data, config)[1],
        rtol=1e-9,
        atol=0,
    )


def test_rofu_kfac_follows_the_exact_closed_form_on_an_mlp():
    net = make_net(hidden=(16, 16))
    data = make_data(400, 6, 4, seed=8)
    config = RofuConfig(l2=1.0)
    contexts = _contexts(40, 6, seed=12)
    kfac, exact = _kfac(net, contexts, data, config), _closed(net, contexts, data, config)[1]
    assert bool((kfac > 0).all())
    ratio = kfac / exact
    assert float(ratio.max() / ratio.min()) < 2.0  # 1.46 here: an approximation
    ranks = torch.stack([kfac.flatten().argsort().argsort(), exact.flatten().argsort().argsort()])
    assert float(torch.corrcoef(ranks.double())[0, 1]) > 0.9  # 0.95 here


@pytest.mark.parametrize("estimator", ["ntk-closed", "ntk-kfac"])
@pytest.mark.parametrize("form", ["per-arm", "arm features"])
def test_rofu_scores_serves_the_closed_forms_through_prepare(estimator, form):
    table = arm_features(5, 3) if form == "arm features" else None
    net = make_net(hidden=(8,), n_arms=4, arm_feature_dim=3 if table is not None else 0)
    data = make_data(60, 6, 5 if table is not None else 4, n_total=400)
    config = RofuConfig(estimator=estimator, l2=0.5, regulariser="arm_count", stability_cap=1.0)
    contexts = _contexts(3, 6)
    direct = rofu_scores(net, contexts, data, config, torch.Generator(), arm_features=table)
    prepared = prepare(net, data, config, torch.Generator(), arm_features=table)
    served = score(prepared, contexts, torch.Generator())
    assert prepared.config.step_size == config.step_size, "no step to resolve in a closed form"
    assert float(direct.bonus.min()) > 0
    torch.testing.assert_close(served.bonus, direct.bonus, rtol=1e-12, atol=0)
    torch.testing.assert_close(served.mean, direct.mean, rtol=1e-12, atol=0)


@pytest.mark.parametrize("estimator", ["ntk-closed", "ntk-kfac"])
def test_rofu_config_refuses_a_closed_form_without_l2(estimator):
    with pytest.raises(ValueError, match=f"l2 must be > 0 for estimator '{estimator}'"):
        RofuConfig(estimator=estimator)


def test_rofu_settings_refuse_a_closed_form_without_l2_naming_it():
    from pydantic import ValidationError

    from rofu.service.settings import Settings

    with pytest.raises(ValidationError, match="l2 must be > 0 for estimator 'ntk-closed'"):
        Settings(estimator="ntk-closed", _env_file=None)
    assert Settings(estimator="ntk-closed", l2=1.0).rofu_config().estimator == "ntk-closed"


def test_rofu_closed_estimates_the_curvature_on_at_most_closed_rows():
    net = make_net(hidden=(8,))
    data = make_data(300, 6, 4, seed=2)
    theta = dict(net.named_parameters())
    drawn = prepare_closed(
        net, theta, data, RofuConfig(l2=1.0, closed_rows=50), torch.Generator(), None
    )
    every = prepare_closed(
        net, theta, data, RofuConfig(l2=1.0, closed_rows=None), torch.Generator(), None
    )
    assert (drawn.size, every.size) == (50, 300)
    again = prepare_closed(
        net, theta, data, RofuConfig(l2=1.0, closed_rows=50), torch.Generator(), None
    )
    torch.testing.assert_close(again.eigenvalues, drawn.eigenvalues)  # one draw per generator


def test_rofu_kfac_estimates_its_factors_on_at_most_kfac_rows():
    net = make_net(hidden=(8,))
    data = make_data(300, 6, 4, seed=2)
    theta = dict(net.named_parameters())

    def factors(rows, seed=0, of=data):
        config = RofuConfig(estimator="ntk-kfac", l2=1.0, kfac_rows=rows)
        return prepare_kfac(net, theta, of, config, torch.Generator().manual_seed(seed), None)

    drawn = torch.randperm(300, generator=torch.Generator().manual_seed(0))[:50]
    subset = factors(None, of=data.with_sample(data.sample.subset(drawn)))

    def eigenvalues(f):
        return [e.values for e in (*f.inputs, *f.outputs, f.last)]

    for got, want in [(factors(50), subset), (factors(300), factors(None))]:
        torch.testing.assert_close(eigenvalues(got), eigenvalues(want))
    assert not torch.allclose(factors(50).last.values, factors(None).last.values)


def test_rofu_kfac_per_arm_blocks_are_each_arms_sum_of_outer_products():
    h = torch.randn(40, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    arms = torch.tensor([0, 2] * 20)  # arm 1 has no rows
    onehot = torch.nn.functional.one_hot(arms, 3).to(torch.float64)
    want = torch.einsum("na,ni,nj->aij", onehot, h, h)
    torch.testing.assert_close(per_arm_blocks(h, arms, 3), want)
