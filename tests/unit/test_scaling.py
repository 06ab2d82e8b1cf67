"""The reward's own scale: prequential noise, standardisation, and what the bonus does with them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rofu.models import (
    Checkpoint,
    FitConfig,
    RewardNet,
    RewardNetConfig,
    RofuConfig,
    Transitions,
    dump_checkpoint,
    load_checkpoint,
)
from rofu.models.data import DataBuffer, Prequential
from rofu.models.policies import RofuPolicy
from rofu.models.rofu import rofu_scores
from rofu.models.scaling import FIXED_NOISE_VARIANCE, resolve_noise
from rofu.models.training import TrainSchedule, fit

CLOSED = RofuConfig(estimator="ntk-closed", l2=0.01, regulariser="arm_count", closed_rows=None)


def test_prequential_update_weights_rows_in_order() -> None:
    squared = torch.tensor([1.0, 4.0, 9.0])
    once = Prequential().updated(squared, 0.5)
    assert once.total == pytest.approx(0.25 * 1 + 0.5 * 4 + 9)
    assert once.weight == pytest.approx(0.25 + 0.5 + 1)
    assert once.variance == pytest.approx(11.25 / 1.75)
    split = Prequential().updated(squared[:1], 0.5).updated(squared[1:], 0.5)
    assert split.variance == pytest.approx(once.variance)
    assert Prequential().updated(squared[:1], 0.9).variance == pytest.approx(1.0)
    assert Prequential().variance is None


def test_prequential_refuses_a_bad_decay() -> None:
    with pytest.raises(ValueError, match="decay"):
        Prequential().updated(torch.ones(2), 0.0)


def test_policy_scores_rows_before_the_refit_that_uses_them() -> None:
    net = RewardNetConfig(context_dim=2, n_arms=2, hidden=(4,))
    schedule = TrainSchedule(every=1, fit=FitConfig(steps=5, prequential_decay=1.0))
    policy = RofuPolicy(net, schedule, CLOSED, seed=1)
    expected = []
    for t in range(4):
        x = torch.full((1, 2), float(t))
        batch = Transitions(x, torch.tensor([t % 2]), torch.tensor([3.0]))
        with torch.no_grad():
            expected.append(float((policy.net(batch.x, batch.arms) - 3.0).square()))
        policy.update(batch)  # refits on the row after scoring it
    assert policy.buffer.noise is not None
    assert policy.buffer.noise.variance == pytest.approx(sum(expected) / 4, rel=1e-5)


def test_fixed_noise_leaves_the_configuration_as_it_is() -> None:
    noise = Prequential(8.0, 2.0)
    assert resolve_noise(CLOSED, noise) is CLOSED
    prequential = dataclasses.replace(CLOSED, noise="prequential")
    resolved = resolve_noise(prequential, noise)
    assert (resolved.noise, resolved.eta, resolved.l2) == ("fixed", 1.0 / 8.0, 0.01 * 8.0)
    assert resolve_noise(resolved, noise) is resolved
    before_any_row = resolve_noise(prequential, None)
    assert (before_any_row.eta, before_any_row.l2) == (CLOSED.eta, CLOSED.l2)
    assert FIXED_NOISE_VARIANCE == 0.5


def test_prequential_bonus_grows_with_sigma_for_a_plain_network() -> None:
    net = RewardNet(RewardNetConfig(context_dim=2, n_arms=2, hidden=(4,)))
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    buffer = DataBuffer(2)
    buffer.append(Transitions(x, torch.tensor([0, 1] * 3), torch.zeros(6)))
    data = buffer.regulariser_data(2)
    config = dataclasses.replace(CLOSED, noise="prequential")
    generator = torch.Generator()
    bonuses = []
    for variance in (0.5, 2.0):
        noisy = dataclasses.replace(data, noise=Prequential(variance, 1.0))
        bonuses.append(rofu_scores(net, x[:2], noisy, config, generator).bonus)
    plain = rofu_scores(net, x[:2], data, CLOSED, generator).bonus
    torch.testing.assert_close(bonuses[0], plain)  # sigma^2 = 1/2 is the fixed noise
    assert bool((bonuses[1] > bonuses[0]).all())


def _run(reward_scale: float) -> RofuPolicy:
    net = RewardNetConfig(context_dim=3, n_arms=2, hidden=(8,))
    fit_config = FitConfig(steps=5, batch_size=64, standardise=True, prequential_decay=0.99)
    config = dataclasses.replace(CLOSED, noise="prequential")
    policy = RofuPolicy(net, TrainSchedule(every=5, fit=fit_config), config, seed=3)
    generator = torch.Generator().manual_seed(5)
    for _ in range(40):
        x = torch.randn(1, 3, generator=generator)
        arm = torch.randint(2, (1,), generator=generator)
        reward = 2.0 + x[:, 0] * (arm * 2 - 1) + 0.3 * torch.randn(1, generator=generator)
        policy.update(Transitions(x, arm, reward * reward_scale))
    return policy


@pytest.mark.parametrize(("scale", "rtol"), [(4.0, 1e-6), (3.0, 1e-3)])
def test_standardised_prequential_bonus_scales_with_the_rewards(scale: float, rtol: float) -> None:
    contexts = torch.randn(5, 3, generator=torch.Generator().manual_seed(9))
    base = _run(1.0).scores(contexts)
    scaled = _run(scale).scores(contexts)
    torch.testing.assert_close(scaled.bonus, scale * base.bonus, rtol=rtol, atol=1e-7)
    torch.testing.assert_close(scaled.mean, scale * base.mean, rtol=rtol, atol=1e-6)
    assert bool((base.bonus > 0).all())


def test_standardising_network_keeps_running_moments() -> None:
    net = RewardNet(RewardNetConfig(context_dim=2, n_arms=1, hidden=(3,), standardise=True))
    generator = torch.Generator().manual_seed(2)
    x, r = torch.randn(30, 2, generator=generator) * 5 + 1, torch.randn(30, generator=generator)
    for part in (slice(0, 7), slice(7, 8), slice(8, 30)):
        net.observe(x[part], r[part])
    mean, scale = net.context_moments()
    torch.testing.assert_close(mean, x.mean(dim=0))
    torch.testing.assert_close(scale, x.var(dim=0, unbiased=False).sqrt())
    torch.testing.assert_close(net.reward_moments()[1], r.var(unbiased=False).sqrt())
    plain = RewardNet(RewardNetConfig(context_dim=2, n_arms=1, hidden=(3,)))
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if k.startswith("layers.")})
    arms = torch.zeros(30, dtype=torch.long)
    standard = plain((x - mean) / scale, arms)
    r_mean, r_scale = net.reward_moments()
    torch.testing.assert_close(net(x, arms), r_mean + r_scale * standard)


def test_standardisation_needs_a_standardising_network() -> None:
    net = RewardNet(RewardNetConfig(context_dim=2, n_arms=1, hidden=(3,)))
    data = Transitions(torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), torch.ones(2))
    with pytest.raises(ValueError, match="standardise"):
        fit(net, data, FitConfig(steps=1, standardise=True), torch.Generator())


def test_rofu_scores_sends_a_standardising_network_through_prepare() -> None:
    policy = _run(1.0)
    data = policy.buffer.regulariser_data(2)
    with pytest.raises(ValueError, match="prepare"):
        rofu_scores(policy.net, torch.zeros(1, 3), data, CLOSED, torch.Generator())


def test_checkpoint_round_trips_noise_and_statistics() -> None:
    policy = _run(2.0)
    net = policy.net
    assert isinstance(net, RewardNet)
    data = policy.buffer.regulariser_data(2)
    checkpoint = Checkpoint(1, net.config, dict(net.state_dict()), data)
    loaded = load_checkpoint(dump_checkpoint(checkpoint))
    assert loaded.data.noise == data.noise
    assert loaded.net_config.standardise
    again = loaded.network()
    x, arms = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    torch.testing.assert_close(again(x, arms), net(x, arms))
    torch.testing.assert_close(again.reward_moments()[0], net.reward_moments()[0])


def test_checkpoint_without_noise_or_statistics_still_loads() -> None:
    config = RewardNetConfig(context_dim=3, n_arms=2, hidden=(4,))
    assert "standardise" not in config.to_json()  # a plain network's document is unchanged
    sample = Transitions(torch.zeros(2, 3), torch.tensor([0, 1]), torch.ones(2))
    buffer = DataBuffer(3)
    buffer.append(sample)
    blob = dump_checkpoint(
        Checkpoint(1, config, dict(RewardNet(config).state_dict()), buffer.regulariser_data(2))
    )
    loaded = load_checkpoint(blob)
    assert loaded.data.noise is None
    assert not loaded.net_config.standardise
