"""ROFU on any reward model: a small CNN with batch norm on image contexts equals the naive
loop (fast path falling back to torch.func, and torch.func itself), in both forms; NTK
equals exact on an image model linear in its parameters, and the explicit linearised
ascent on the CNN; the network's mode and buffers are left as they were; on a GPU it
equals the CPU; the neural policies run on the CNN (those that read an MLP's layers refuse it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

from rofu.models import (
    ConvRewardNetConfig,
    FitConfig,
    PairModel,
    PerArmModel,
    RofuConfig,
    Transitions,
    rofu_scores,
)
from rofu.models.policies import (
    Bootstrap,
    Dropout,
    EpsilonGreedy,
    EpsilonGreedyParams,
    Greedy,
    NeuralLinear,
    NeuralUCB,
    NeuralUCBParams,
    ParamNoise,
    ParamNoiseParams,
    RofuPolicy,
    TrainSchedule,
)
from rofu.models.rofu_naive import rofu_scores_naive
from tests.factories import IMAGE, arm_features, make_conv_net, make_data
from tests.unit.test_rofu_ntk import JIT_WARNING, _linearised_ascent

CASES = [
    # (description, network kwargs, rofu config kwargs)
    ("dataset form", {}, {}),
    ("arm_count form with l2", {}, {"regulariser": "arm_count", "l2": 0.3}),
    ("drift baseline", {}, {"baseline": "drift"}),
    (
        "drift, arm_count with l2, decay",
        {},
        {"baseline": "drift", "regulariser": "arm_count", "l2": 0.3, "step_decay": 0.7},
    ),
    ("chunked pairs, whole sample", {}, {"chunk_size": 3, "minibatch_size": None, "eta": 0.05}),
    ("no batch norm, tanh", {"batch_norm": False, "activation": "tanh"}, {"eta": 0.3}),
]
FORMS = ["per-arm", "arm features"]


def _images(batch: int, seed: int = 3) -> Tensor:
    return torch.randn(batch, *IMAGE, generator=torch.Generator().manual_seed(seed)).double()


def _problem(form: str, **net_kwargs: object):
    """A CNN of the form, its regulariser data (4 or 5 arms), arm features, contexts.

    The rewards are the network's own predictions plus noise, so theta sits near the
    minimiser of R and the `start` baseline's bonus is not swamped by R's own descent."""
    features = arm_features(5, 3) if form == "arm features" else None
    net = make_conv_net(arm_feature_dim=0 if features is None else 3, **net_kwargs)
    data = make_data(60, IMAGE, 4 if features is None else 5, n_total=300)
    x, arms = data.sample.x, data.sample.arms
    with torch.no_grad():
        noise = 0.1 * torch.randn(len(arms), generator=torch.Generator().manual_seed(1))
        rewards = net.eval()(x, arms, features) + noise.double()
    sample = Transitions(x, arms, rewards)
    net.train()  # as a caller may hold it; ROFU must score in eval mode regardless
    return net, dataclasses.replace(data, sample=sample), features, _images(2)


def _scores(net, contexts, data, config, features, *, naive=False, **kwargs):
    score = rofu_scores_naive if naive else rofu_scores
    generator = torch.Generator().manual_seed(7)
    return score(net, contexts, data, config, generator, arm_features=features, **kwargs)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "net_kwargs", "rofu_kwargs"), CASES, ids=[c[0] for c in CASES])
def test_rofu_cnn_batched_equals_naive_loop(name, net_kwargs, rofu_kwargs, form):
    net, data, features, contexts = _problem(form, **net_kwargs)
    config = RofuConfig(**{"steps": 3, "step_size": 0.5, "minibatch_size": 16, **rofu_kwargs})
    naive = _scores(net, contexts, data, config, features, naive=True)
    assert bool((naive.bonus > 0).any()), "the case must exercise a non-zero bonus"
    for kernel in ("fast", "functional"):
        batched = _scores(net, contexts, data, config, features, kernel=kernel)
        torch.testing.assert_close(batched.mean, naive.mean, rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(batched.bonus, naive.bonus, rtol=1e-5, atol=1e-9)


def test_rofu_cnn_with_candidates_leaves_nan_elsewhere_and_equals_naive():
    net, data, features, contexts = _problem("arm features")
    candidates = torch.tensor([[True, False, True, True, False], [False] * 4 + [True]])
    config = RofuConfig(steps=2, step_size=0.5, minibatch_size=16, baseline="drift")
    batched = _scores(net, contexts, data, config, features, candidates=candidates)
    naive = _scores(net, contexts, data, config, features, candidates=candidates, naive=True)
    assert torch.equal(batched.ucb.isnan(), ~candidates)
    torch.testing.assert_close(batched.ucb, naive.ucb, rtol=1e-5, atol=1e-9, equal_nan=True)


def test_rofu_cnn_fast_kernel_falls_back_to_the_functional_path_exactly():
    net, data, features, contexts = _problem("per-arm")
    config = RofuConfig(steps=3, step_size=0.5, minibatch_size=16)
    fast = _scores(net, contexts, data, config, features, kernel="fast")
    functional = _scores(net, contexts, data, config, features, kernel="functional")
    torch.testing.assert_close(fast.mean, functional.mean, rtol=0, atol=0)
    torch.testing.assert_close(fast.bonus, functional.bonus, rtol=0, atol=0)


@pytest.mark.parametrize("estimator", ["exact", "ntk"])
def test_rofu_cnn_runs_in_eval_mode_and_leaves_mode_and_buffers_untouched(estimator):
    net, data, features, contexts = _problem("per-arm")
    config = RofuConfig(steps=3, step_size=0.5, minibatch_size=16, estimator=estimator)
    want = _scores(net.eval(), contexts, data, config, features)
    net.train()
    net.norms[0].eval()  # a mixed mode comes back as it was, module by module
    before = {k: v.clone() for k, v in net.state_dict().items()}
    got = _scores(net, contexts, data, config, features)
    assert net.training
    assert [norm.training for norm in net.norms] == [False, True]
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)
    torch.testing.assert_close(got.bonus, want.bonus, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(got.mean, net.eval().score_all(contexts))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("estimator", ["exact", "ntk"])
@pytest.mark.parametrize("form", FORMS)
def test_rofu_cnn_on_cuda_equals_cpu(form, estimator):
    # float64 on both devices: the convolutions and batch norm differ only in summation order.
    net, data, features, contexts = _problem(form)
    config = RofuConfig(steps=3, step_size=0.5, minibatch_size=16, estimator=estimator)
    cpu = _scores(net, contexts, data, config, features)
    gpu = _scores(
        net.cuda(), contexts.cuda(), data, config, None if features is None else features.cuda()
    )
    assert gpu.bonus.is_cuda
    assert bool((cpu.bonus > 0).any()), "the case must exercise a non-zero bonus"
    torch.testing.assert_close(gpu.mean.cpu(), cpu.mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gpu.bonus.cpu(), cpu.bonus, rtol=1e-7, atol=1e-10)


class _LinearPair(nn.Module):
    """f(x, z) = w . [flatten(x); z] + b: linear in its parameters."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 1)

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        out: Tensor = self.linear(torch.cat([x.flatten(1), z], dim=1))
        return out  # (N, 1)


def _linear_image_model(form: str):
    torch.manual_seed(0)
    width = IMAGE[0] * IMAGE[1] * IMAGE[2]
    if form == "per-arm":
        return PerArmModel(nn.Sequential(nn.Flatten(), nn.Linear(width, 4)), IMAGE, 4).double()
    return PairModel(_LinearPair(width + 3), IMAGE, 3).double()


@pytest.mark.parametrize("baseline", ["start", "drift"])
@pytest.mark.parametrize("form", FORMS)
def test_ntk_equals_exact_on_an_image_model_linear_in_its_parameters(form, baseline):
    _, data, features, contexts = _problem(form)
    net = _linear_image_model(form)
    config = RofuConfig(
        step_size=0.05, minibatch_size=16, regulariser="arm_count", l2=0.3, baseline=baseline
    )
    exact = _scores(net, contexts, data, config, features)
    ntk = _scores(net, contexts, data, dataclasses.replace(config, estimator="ntk"), features)
    assert float(exact.bonus.max()) > 0.01, "the case must exercise a non-zero bonus"
    torch.testing.assert_close(ntk.mean, exact.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ntk.bonus, exact.bonus, rtol=1e-9, atol=1e-12)


@pytest.mark.filterwarnings(JIT_WARNING)
@pytest.mark.parametrize("form", FORMS)
def test_ntk_on_a_cnn_equals_explicit_ascent_on_the_linearised_objective(form):
    net, data, features, contexts = _problem(form)
    config = RofuConfig(steps=3, step_size=0.5, minibatch_size=16, estimator="ntk")
    got = _scores(net, contexts, data, config, features)
    with torch.no_grad():
        net.eval()  # the definition reads batch norm's running statistics too
    want = _linearised_ascent(
        net, contexts, data, config, torch.Generator().manual_seed(7), features
    )
    assert float(want.max()) > 1e-3
    torch.testing.assert_close(got.bonus, want, rtol=1e-8, atol=1e-10)


# --- neural policies on a CNN ---------------------------------------------------------------


CNN_FIT = FitConfig(steps=4, batch_size=16, optimizer="adam", lr=0.01)
CNN_SCHEDULE = TrainSchedule(every=6, fit=CNN_FIT)
CNN_ROFU = RofuConfig(steps=2, step_size=0.1, minibatch_size=8, eta=0.05)


def _cnn_config(form: str) -> ConvRewardNetConfig:
    arms = {"arm_feature_dim": 3} if form == "arm features" else {"n_arms": 4}
    return ConvRewardNetConfig(context_shape=IMAGE, channels=(4,), hidden=(6,), **arms)


def _features(form: str) -> dict[str, Tensor]:
    return {"arm_features": arm_features(4, 3)} if form == "arm features" else {}


def _play(policy, rounds: int = 4, batch: int = 3) -> list[dict[str, float]]:
    """Select and update on a seeded image bandit (the reward is one pixel of a channel
    the arm picks); every decision is checked against its candidates."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True] * 4, [False, True, True, False], [True, False, False, True]])
    metrics = []
    for _ in range(rounds):
        x = torch.randn(batch, *IMAGE, generator=gen)
        decision = policy.select(x, mask)
        assert bool(mask[torch.arange(batch), decision.arms].all())
        assert bool(((decision.propensity > 0) & (decision.propensity <= 1)).all())
        assert torch.equal(decision.scores.ucb.isnan(), ~mask)
        rewards = x[torch.arange(batch), decision.arms % IMAGE[0], 0, 0]
        metrics.append(policy.update(Transitions(x, decision.arms, rewards)))
    return metrics


@pytest.mark.parametrize("estimator", ["exact", "ntk"])
@pytest.mark.parametrize("form", FORMS)
def test_rofu_policy_with_a_cnn_selects_updates_and_trains_in_train_mode(form, estimator):
    rofu = dataclasses.replace(CNN_ROFU, estimator=estimator)
    policy = RofuPolicy(_cnn_config(form), CNN_SCHEDULE, rofu, seed=2, **_features(form))
    initial = policy.net.norms[0].running_mean.clone()
    metrics = _play(policy)
    assert sum(m["trained"] for m in metrics) == 2, "refits after rows 6 and 12"
    assert not policy.net.training, "back in eval mode after each refit"
    assert not torch.equal(policy.net.norms[0].running_mean, initial), "fit used train mode"
    assert bool((policy.select(_images(2).float()).scores.bonus > 0).any())


def test_rofu_policy_with_a_cnn_scores_equal_rofu_scores_on_its_buffer():
    policy = RofuPolicy(_cnn_config("per-arm"), CNN_SCHEDULE, CNN_ROFU, seed=1)
    _play(policy)
    x = _images(2).float()
    generator = torch.Generator()
    generator.set_state(policy.generator.get_state())  # the minibatches the policy will draw
    decision = policy.select(x)
    data = policy.buffer.regulariser_data(4)
    want = rofu_scores(policy.net, x, data, CNN_ROFU, generator)
    torch.testing.assert_close(decision.scores.mean, want.mean)
    torch.testing.assert_close(decision.scores.bonus, want.bonus)


BASELINES_ON_A_CNN = {
    "Greedy": lambda form: Greedy(_cnn_config(form), CNN_SCHEDULE, **_features(form)),
    "EpsilonGreedy": lambda form: EpsilonGreedy(
        _cnn_config(form), CNN_SCHEDULE, EpsilonGreedyParams(epsilon=0.3), **_features(form)
    ),
    "NeuralUCB": lambda form: NeuralUCB(
        _cnn_config(form), CNN_SCHEDULE, NeuralUCBParams(z="full"), **_features(form)
    ),
    "ParamNoise": lambda form: ParamNoise(
        _cnn_config(form), CNN_SCHEDULE, ParamNoiseParams(d_samples=5), **_features(form)
    ),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", sorted(BASELINES_ON_A_CNN))
def test_model_agnostic_policies_run_on_a_cnn(name, form):
    policy = BASELINES_ON_A_CNN[name](form)
    assert sum(m["trained"] for m in _play(policy)) == 2
    assert not policy.net.training


@pytest.mark.parametrize("policy", [NeuralLinear, Bootstrap, Dropout])
def test_mlp_only_policies_refuse_a_cnn_naming_the_network(policy):
    with pytest.raises(TypeError, match=r"^net_config must .*RewardNet"):
        policy(_cnn_config("per-arm"))
