"""fit: determinism, warm starts, optimisers, schedules, clipping, metrics and errors."""

from __future__ import annotations

import math

import pytest
import torch

from rofu.models import FitConfig, RewardNet, RewardNetConfig, Transitions, fit
from rofu.models.training import make_optimizer
from tests.factories import arm_features, linear_problem, make_net, make_transitions


def _params(net: RewardNet) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in net.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mse(net: RewardNet, data: Transitions, features: torch.Tensor | None = None) -> float:
    with torch.no_grad():
        return float((net(data.x, data.arms, features) - data.rewards).square().mean())


def _linear() -> tuple[RewardNet, Transitions]:
    """A per-arm linear model and a linear-Gaussian problem it can fit (noise std 0.1)."""
    _, data = linear_problem(400, 5, 3, seed=1)
    return make_net(5, 3, hidden=(), bias=False), data


# --- determinism and warm starts ------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "rmsprop"])
def test_fit_is_deterministic_by_generator_seed(optimizer):
    data = make_transitions(300, 6, 4, seed=2)
    config = FitConfig(steps=30, batch_size=32, optimizer=optimizer, lr=0.01, momentum=0.0)

    def trained(seed: int) -> dict[str, torch.Tensor]:
        net = make_net(seed=1)
        torch.manual_seed(seed + 100)  # the global RNG must not matter
        fit(net, data, config, torch.Generator().manual_seed(seed))
        return _params(net)

    first = trained(7)
    assert _same(first, trained(7))
    assert not _same(first, trained(8)), "minibatches come from the generator"


def test_fit_with_zero_steps_changes_nothing():
    net, data = _linear()
    before = _params(net)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    metrics = fit(net, data, FitConfig(steps=0), generator)
    assert _same(before, _params(net))
    assert torch.equal(state, generator.get_state())
    assert metrics["steps"] == 0.0
    assert math.isnan(metrics["loss"])
    assert math.isnan(metrics["loss_first"])
    assert metrics["grad_norm"] == 0.0


def test_fit_continues_from_the_current_weights():
    net, data = _linear()
    config = FitConfig(steps=40, batch_size=64, optimizer="adam", lr=0.02)
    generator = torch.Generator().manual_seed(0)
    loss_0 = _mse(net, data)
    first = fit(net, data, config, generator)
    loss_1 = _mse(net, data)
    second = fit(net, data, config, generator)
    loss_2 = _mse(net, data)
    assert loss_2 < loss_1 < loss_0
    # the second call starts where the first ended, not from the initialisation
    assert second["loss_first"] < 0.5 * first["loss_first"]
    assert second["loss_first"] < 2.0 * first["loss"]


def test_fit_from_trained_weights_matches_one_longer_run_with_sgd():
    # Plain SGD has no optimiser state, so two calls of k steps equal one call of 2k steps
    # when the minibatches are the same (one generator across both calls).
    data = make_transitions(200, 6, 4, seed=5)
    config = FitConfig(steps=10, batch_size=16, optimizer="sgd", lr=0.05)
    split, whole = make_net(seed=2), make_net(seed=2)
    generator = torch.Generator().manual_seed(3)
    fit(split, data, config, generator)
    fit(split, data, config, generator)
    longer = FitConfig(steps=20, batch_size=16, optimizer="sgd", lr=0.05)
    fit(whole, data, longer, torch.Generator().manual_seed(3))
    for name, value in _params(whole).items():
        torch.testing.assert_close(split.state_dict()[name], value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_fit_continuing_an_optimizer_matches_one_longer_run(optimizer):
    # With its moment estimates handed on, a stateful optimiser's two calls of k steps are
    # one run of 2k steps; a fresh optimiser per call is not.
    data = make_transitions(200, 6, 4, seed=5)
    config = FitConfig(steps=10, batch_size=16, optimizer=optimizer, lr=0.01)
    split, fresh, whole = make_net(seed=2), make_net(seed=2), make_net(seed=2)
    kept = make_optimizer(split, config)
    generator, fresh_generator = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(2):
        fit(split, data, config, generator, optimizer=kept)
        fit(fresh, data, config, fresh_generator)
    longer = FitConfig(steps=20, batch_size=16, optimizer=optimizer, lr=0.01)
    fit(whole, data, longer, torch.Generator().manual_seed(3))
    for name, value in _params(whole).items():
        torch.testing.assert_close(split.state_dict()[name], value, rtol=1e-6, atol=1e-7)
    assert not _same(_params(fresh), _params(whole))


def test_fit_refuses_an_optimizer_over_another_network():
    data = make_transitions(50, 6, 4, seed=5)
    config = FitConfig(steps=2, batch_size=8)
    net, other = make_net(seed=2), make_net(seed=3)
    before = _params(net)
    with pytest.raises(ValueError, match="optimizer must hold exactly the parameters of net"):
        fit(net, data, config, torch.Generator(), optimizer=make_optimizer(other, config))
    assert _same(before, _params(net))


# --- learning -------------------------------------------------------------------------------


@pytest.mark.parametrize(("optimizer", "lr"), [("sgd", 0.1), ("adam", 0.05), ("rmsprop", 0.01)])
def test_fit_loss_decreases_on_a_linear_problem(optimizer, lr):
    net, data = _linear()
    before = _mse(net, data)
    metrics = fit(
        net,
        data,
        FitConfig(steps=300, batch_size=64, optimizer=optimizer, lr=lr),
        torch.Generator().manual_seed(0),
    )
    after = _mse(net, data)
    assert after < 0.05 * before
    assert after < 0.05, "close to the noise floor of 0.01"
    assert metrics["loss"] < 0.1 * metrics["loss_first"]


def test_fit_learns_the_true_weights_of_a_linear_problem():
    weights, data = linear_problem(400, 5, 3, seed=1)
    net = make_net(5, 3, hidden=(), bias=False)
    fit(
        net,
        data,
        FitConfig(steps=400, batch_size=400, optimizer="sgd", lr=0.3),
        torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(net.state_dict()["layers.0.weight"], weights, rtol=0, atol=0.05)


def test_fit_trains_an_arm_feature_network():
    features = arm_features(4, 3)
    data = make_transitions(200, 6, 4, seed=1)
    target = data.rewards + features[data.arms, 0]  # depends on the arm's features
    data = Transitions(data.x, data.arms, target)
    net = make_net(arm_feature_dim=3, hidden=(16,))
    before = _mse(net, data, features)
    fit(
        net,
        data,
        FitConfig(steps=200, batch_size=64, lr=0.01),
        torch.Generator().manual_seed(0),
        arm_features=features,
    )
    assert _mse(net, data, features) < 0.7 * before


def test_fit_casts_data_to_the_network_dtype():
    net = make_net(dtype=torch.float32)
    data = make_transitions(50, 6, 4)  # float64
    metrics = fit(net, data, FitConfig(steps=3, batch_size=8), torch.Generator().manual_seed(0))
    assert math.isfinite(metrics["loss"])
    assert all(p.dtype == torch.float32 for p in net.parameters())


# --- schedules ------------------------------------------------------------------------------


def test_fit_config_lr_at_constant():
    config = FitConfig(steps=10, lr=0.3, lr_decay=5.0)
    assert [config.lr_at(k) for k in (0, 1, 9, 100)] == [0.3] * 4


def test_fit_config_lr_at_inverse_time():
    config = FitConfig(steps=10, lr=0.3, lr_schedule="inverse_time", lr_decay=0.5)
    for k in (0, 1, 2, 7):
        assert config.lr_at(k) == pytest.approx(0.3 / (1.0 + 0.5 * k))
    assert FitConfig(lr=0.3, lr_schedule="inverse_time").lr_at(50) == pytest.approx(0.3)


def test_fit_config_lr_at_cosine():
    config = FitConfig(steps=10, lr=0.4, lr_schedule="cosine")
    assert config.lr_at(0) == pytest.approx(0.4)
    assert config.lr_at(5) == pytest.approx(0.2)
    assert config.lr_at(10) == pytest.approx(0.0, abs=1e-15)
    assert config.lr_at(2) == pytest.approx(0.2 * (1 + math.cos(math.pi * 0.2)))
    rates = [config.lr_at(k) for k in range(11)]
    assert all(a > b for a, b in zip(rates, rates[1:], strict=False)), "strictly decreasing"


@pytest.mark.parametrize(
    ("schedule", "decay"), [("constant", 0.0), ("inverse_time", 0.7), ("cosine", 0.0)]
)
def test_fit_applies_the_schedule_to_each_step(schedule, decay):
    # Full-batch plain SGD on an MSE: each step is theta -= lr_at(k) * grad, whatever the
    # row order of the minibatch (a permutation of all rows).
    net, data = _linear()
    config = FitConfig(
        steps=4, batch_size=len(data), optimizer="sgd", lr=0.2, lr_schedule=schedule, lr_decay=decay
    )
    want = net.state_dict()["layers.0.weight"].clone()
    for k in range(4):
        w = want.clone().requires_grad_(True)
        loss = ((data.x * w[data.arms]).sum(dim=1) - data.rewards).square().mean()
        (grad,) = torch.autograd.grad(loss, w)
        want = want - config.lr_at(k) * grad
    metrics = fit(net, data, config, torch.Generator().manual_seed(0))
    torch.testing.assert_close(net.state_dict()["layers.0.weight"], want, rtol=1e-10, atol=1e-12)
    assert metrics["lr"] == pytest.approx(config.lr_at(3))


# --- clipping -------------------------------------------------------------------------------


def _one_sgd_step(max_grad_norm: float | None) -> tuple[float, float]:
    """(reported grad norm, distance the parameters moved) after one full-batch SGD step."""
    net = make_net(seed=4)
    data = make_transitions(64, 6, 4, seed=4)
    data = Transitions(data.x, data.arms, 10.0 * data.rewards + 5.0)  # large gradients
    before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    config = FitConfig(steps=1, batch_size=64, optimizer="sgd", lr=0.1, max_grad_norm=max_grad_norm)
    metrics = fit(net, data, config, torch.Generator().manual_seed(0))
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    return metrics["grad_norm"], float((after - before).norm())


def test_fit_max_grad_norm_clips_the_update():
    free_norm, free_move = _one_sgd_step(None)
    clipped_norm, clipped_move = _one_sgd_step(0.5)
    assert free_norm > 5.0, "the case must need clipping"
    assert clipped_norm == pytest.approx(free_norm, rel=1e-12), "grad_norm is before clipping"
    assert free_move == pytest.approx(0.1 * free_norm, rel=1e-9)
    assert clipped_move <= 0.1 * 0.5 * (1 + 1e-6)
    assert clipped_move == pytest.approx(0.1 * 0.5, rel=1e-5)


def test_fit_max_grad_norm_leaves_small_gradients_alone():
    free_norm, free_move = _one_sgd_step(None)
    clipped_norm, clipped_move = _one_sgd_step(10 * free_norm)
    assert clipped_norm == pytest.approx(free_norm, rel=1e-12)
    assert clipped_move == pytest.approx(free_move, rel=1e-12)


# --- metrics --------------------------------------------------------------------------------


def test_fit_metrics_keys_and_values():
    net, data = _linear()
    config = FitConfig(
        steps=20, batch_size=50, optimizer="sgd", lr=0.1, lr_schedule="inverse_time", lr_decay=0.1
    )
    metrics = fit(net, data, config, torch.Generator().manual_seed(0))
    assert set(metrics) == {"loss", "loss_first", "steps", "rows", "grad_norm", "lr"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["steps"] == 20.0
    assert metrics["rows"] == 400.0
    assert metrics["lr"] == pytest.approx(0.1 / (1 + 0.1 * 19))
    assert metrics["grad_norm"] > 0.0
    assert 0.0 < metrics["loss"] < metrics["loss_first"]


def test_fit_metric_loss_first_is_the_initial_minibatch_loss():
    net, data = _linear()
    initial = _mse(net, data)
    metrics = fit(
        net,
        data,
        FitConfig(steps=1, batch_size=len(data), optimizer="sgd"),
        torch.Generator().manual_seed(0),
    )
    assert metrics["loss_first"] == pytest.approx(initial, rel=1e-12)
    assert metrics["loss"] == metrics["loss_first"]


def test_fit_metric_loss_averages_the_last_tenth_of_updates():
    # With lr tiny the loss barely moves, so loss ~ loss_first; with 10 steps the tail is the
    # last update only, with 30 steps the last three.
    net, data = _linear()
    metrics = fit(
        net,
        data,
        FitConfig(steps=30, batch_size=8, optimizer="sgd", lr=1e-12),
        torch.Generator().manual_seed(0),
    )
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        rows = torch.randint(len(data), (8,), generator=generator)
        losses.append(_mse(net, data.subset(rows)))
    assert metrics["loss"] == pytest.approx(sum(losses[-3:]) / 3, rel=1e-6)
    assert metrics["loss_first"] == pytest.approx(losses[0], rel=1e-6)


# --- errors ---------------------------------------------------------------------------------


BAD_FIT_CONFIGS = [
    ({"steps": -1}, ValueError, "steps"),
    ({"steps": 1.0}, TypeError, "steps"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"optimizer": "lbfgs"}, ValueError, "optimizer"),
    ({"lr": 0.0}, ValueError, "lr"),
    ({"lr": -1e-3}, ValueError, "lr"),
    ({"lr": float("nan")}, ValueError, "lr"),
    ({"lr": "0.1"}, TypeError, "lr"),
    ({"lr_schedule": "step"}, ValueError, "lr_schedule"),
    ({"lr_decay": -0.1}, ValueError, "lr_decay"),
    ({"momentum": 1.5}, ValueError, "momentum"),
    ({"momentum": -0.1}, ValueError, "momentum"),
    ({"weight_decay": -1.0}, ValueError, "weight_decay"),
    ({"max_grad_norm": 0.0}, ValueError, "max_grad_norm"),
    ({"max_grad_norm": float("inf")}, ValueError, "max_grad_norm"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), BAD_FIT_CONFIGS, ids=[f"{c[2]}={c[0]}" for c in BAD_FIT_CONFIGS]
)
def test_fit_config_rejects_bad_values_naming_them(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name} "):
        FitConfig(**kwargs)


def test_fit_rejects_empty_data():
    net = make_net()
    empty = Transitions(
        torch.empty(0, 6, dtype=torch.float64),
        torch.empty(0, dtype=torch.int64),
        torch.empty(0, dtype=torch.float64),
    )
    with pytest.raises(ValueError, match="data"):
        fit(net, empty, FitConfig(steps=1), torch.Generator())


def test_fit_rejects_data_that_is_not_transitions():
    net = make_net()
    with pytest.raises(ValueError, match="data must be a non-empty Transitions"):
        fit(net, (torch.zeros(2, 6),), FitConfig(steps=1), torch.Generator())  # type: ignore[arg-type]


def test_fit_rejects_data_of_the_wrong_width():
    net = make_net(context_dim=6)
    with pytest.raises(ValueError, match=r"data\.x must have 6 features"):
        fit(net, make_transitions(10, 5, 4), FitConfig(steps=1), torch.Generator())


def test_fit_rejects_an_arm_beyond_the_network():
    net = make_net(n_arms=4)
    before = _params(net)
    with pytest.raises(ValueError, match=r"data\.arms"):
        fit(net, make_transitions(10, 6, 5), FitConfig(steps=1), torch.Generator())
    assert _same(before, _params(net)), "nothing was trained"


def test_fit_rejects_an_arm_beyond_the_arm_feature_table():
    net = make_net(arm_feature_dim=3)
    data = make_transitions(10, 6, 5)
    with pytest.raises(ValueError, match=r"data\.arms"):
        fit(net, data, FitConfig(steps=1), torch.Generator(), arm_features=arm_features(4, 3))
    with pytest.raises(ValueError, match="arm_features"):
        fit(net, data, FitConfig(steps=1), torch.Generator())


# --- dropout --------------------------------------------------------------------------------


def _dropout_net(dropout: float) -> RewardNet:
    config = RewardNetConfig(context_dim=6, n_arms=4, hidden=(32,), dropout=dropout, seed=5)
    return RewardNet(config).double()


def test_fit_with_dropout_generator_is_reproducible():
    data = make_transitions(100, 6, 4, seed=3)
    config = FitConfig(steps=10, batch_size=20, lr=0.01)

    def trained(dropout_seed: int) -> dict[str, torch.Tensor]:
        net = _dropout_net(0.5)
        fit(
            net,
            data,
            config,
            torch.Generator().manual_seed(0),
            dropout_generator=torch.Generator().manual_seed(dropout_seed),
        )
        return _params(net)

    first = trained(1)
    assert _same(first, trained(1))
    assert not _same(first, trained(2)), "masks come from the dropout generator"


def test_fit_without_dropout_generator_trains_without_dropout():
    data = make_transitions(100, 6, 4, seed=3)
    config = FitConfig(steps=10, batch_size=20, lr=0.01)
    with_rate, without_rate = _dropout_net(0.5), _dropout_net(0.0)
    fit(with_rate, data, config, torch.Generator().manual_seed(0))
    fit(without_rate, data, config, torch.Generator().manual_seed(0))
    assert _same(_params(with_rate), _params(without_rate))
