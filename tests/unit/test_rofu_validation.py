"""rofu_scores and RofuConfig: argument checks, gradient modes, weights, minibatches, CUDA."""

from __future__ import annotations

import math

import pytest
import torch

from rofu.models import RegulariserData, RofuConfig, Transitions, rofu_scores
from rofu.models.rofu import minibatch_indices, regulariser_weights
from rofu.models.rofu_naive import rofu_scores_naive
from tests.factories import IMAGE, arm_features, make_conv_net, make_data, make_net

CONFIG = RofuConfig(steps=3, step_size=0.05, minibatch_size=16)


def _contexts(b: int = 3, d: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _score(net=None, contexts=None, data=None, config=CONFIG, seed=0, **kwargs):
    return rofu_scores(
        make_net() if net is None else net,
        _contexts() if contexts is None else contexts,
        make_data(40, 6, 4) if data is None else data,
        config,
        torch.Generator().manual_seed(seed),
        **kwargs,
    )


# --- RofuConfig -----------------------------------------------------------------------------


BAD_CONFIGS = [
    ({"steps": -1}, ValueError, "steps"),
    ({"steps": 2.0}, TypeError, "steps"),
    ({"step_size": 0.0}, ValueError, "step_size"),
    ({"step_size": -0.1}, ValueError, "step_size"),
    ({"step_size": float("nan")}, ValueError, "step_size"),
    ({"step_decay": 0.0}, ValueError, "step_decay"),
    ({"step_decay": 1.01}, ValueError, "step_decay"),
    ({"step_decay": -0.5}, ValueError, "step_decay"),
    ({"eta": 0.0}, ValueError, "eta"),
    ({"eta": -1.0}, ValueError, "eta"),
    ({"eta": float("inf")}, ValueError, "eta"),
    ({"regulariser": "l2"}, ValueError, "regulariser"),
    ({"regulariser": "Dataset"}, ValueError, "regulariser"),
    ({"l2": -0.1}, ValueError, "l2"),
    ({"l2": "0"}, TypeError, "l2"),
    ({"minibatch_size": 0}, ValueError, "minibatch_size"),
    ({"minibatch_size": 16.0}, TypeError, "minibatch_size"),
    ({"bonus_scale": -1.0}, ValueError, "bonus_scale"),
    ({"chunk_size": 0}, ValueError, "chunk_size"),
    ({"chunk_size": True}, TypeError, "chunk_size"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), BAD_CONFIGS, ids=[f"{c[2]}={c[0]}" for c in BAD_CONFIGS]
)
def test_rofu_config_rejects_bad_values_naming_them(kwargs, error, name):
    with pytest.raises(error, match=rf"^{name} "):
        RofuConfig(**kwargs)


def test_rofu_config_accepts_the_edges():
    RofuConfig(steps=0, step_decay=1.0, l2=0.0, minibatch_size=None, bonus_scale=0.0)
    RofuConfig(step_decay=1e-9, minibatch_size=1, chunk_size=1, regulariser="arm_count")


# --- rofu_scores argument checks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("contexts", "error"),
    [
        (torch.zeros(3, 5, dtype=torch.float64), ValueError),
        (torch.zeros(3, 7, dtype=torch.float64), ValueError),
        (torch.zeros(6, dtype=torch.float64), ValueError),
        (torch.zeros(1, 3, 6, dtype=torch.float64), ValueError),
        (torch.tensor([[0.0] * 5 + [math.nan]]), ValueError),
        (torch.tensor([[0.0] * 5 + [math.inf]]), ValueError),
        (torch.tensor([[0.0] * 5 + [-math.inf]]), ValueError),
        (torch.zeros(3, 6, dtype=torch.int64), TypeError),
        (torch.zeros(3, 6, dtype=torch.bool), TypeError),
        ([[0.0] * 6], TypeError),
    ],
    ids=["narrow", "wide", "1-d", "3-d", "nan", "inf", "-inf", "int64", "bool", "list"],
)
def test_rofu_scores_rejects_bad_contexts(contexts, error):
    with pytest.raises(error, match=r"^contexts "):
        _score(contexts=contexts)


@pytest.mark.parametrize(
    ("candidates", "error"),
    [
        (torch.ones(3, 5, dtype=torch.bool), ValueError),
        (torch.ones(2, 4, dtype=torch.bool), ValueError),
        (torch.ones(12, dtype=torch.bool), ValueError),
        (torch.ones(3, 4, dtype=torch.int64), TypeError),
        (torch.ones(3, 4), TypeError),
        ([[True] * 4] * 3, TypeError),
    ],
    ids=["too many arms", "too few contexts", "flat", "int64", "float", "list"],
)
def test_rofu_scores_rejects_bad_candidates(candidates, error):
    with pytest.raises(error, match=r"^candidates "):
        _score(candidates=candidates)


def test_rofu_scores_rejects_arm_features_for_a_per_arm_network():
    with pytest.raises(ValueError, match="arm_features must be None"):
        _score(arm_features=arm_features(4, 3))


@pytest.mark.parametrize(
    ("features", "error"),
    [
        (None, TypeError),
        (torch.zeros(4, 2, dtype=torch.float64), ValueError),
        (torch.zeros(4, 4, dtype=torch.float64), ValueError),
        (torch.zeros(12, dtype=torch.float64), ValueError),
        (torch.zeros(4, 3, dtype=torch.int64), TypeError),
        (torch.full((4, 3), math.nan, dtype=torch.float64), ValueError),
    ],
    ids=["missing", "narrow", "wide", "1-d", "int64", "nan"],
)
def test_rofu_scores_rejects_bad_arm_features_for_an_arm_feature_network(features, error):
    net = make_net(arm_feature_dim=3, hidden=(8,))
    with pytest.raises(error, match=r"^arm_features "):
        _score(net=net, arm_features=features)


def test_rofu_scores_rejects_an_empty_data_sample():
    empty = Transitions(
        torch.empty(0, 6, dtype=torch.float64),
        torch.empty(0, dtype=torch.int64),
        torch.empty(0, dtype=torch.float64),
    )
    data = RegulariserData(empty, 5, torch.tensor([5, 0, 0, 0]))
    with pytest.raises(ValueError, match="data.sample is empty"):
        _score(data=data)


def test_rofu_scores_rejects_data_with_an_arm_beyond_the_network():
    with pytest.raises(ValueError, match=r"data\.sample\.arms refers to an arm >= 4"):
        _score(data=make_data(40, 6, 5))


def test_rofu_scores_rejects_data_beyond_the_arm_feature_table():
    net = make_net(arm_feature_dim=3, hidden=(8,))
    with pytest.raises(ValueError, match=r"data\.sample\.arms refers to an arm >= 3"):
        _score(net=net, data=make_data(40, 6, 4), arm_features=arm_features(3, 3))


def test_rofu_scores_rejects_data_of_the_wrong_width():
    with pytest.raises(ValueError, match=r"data\.sample\.x must have 6 features"):
        _score(data=make_data(40, 5, 4))


def test_rofu_scores_rejects_data_that_is_not_regulariser_data():
    with pytest.raises(TypeError, match="data must be RegulariserData"):
        _score(data=make_data(40, 6, 4).sample)


def test_rofu_scores_rejects_params_with_wrong_keys():
    net = make_net()
    params = dict(net.named_parameters())
    missing = {k: v for k, v in params.items() if k != "layers.0.bias"}
    extra = params | {"layers.9.weight": torch.zeros(1)}
    renamed = {k.replace("layers", "blocks"): v for k, v in params.items()}
    for bad in (missing, extra, renamed, {}):
        with pytest.raises(ValueError, match="params must have exactly the keys"):
            _score(net=net, params=bad)


def test_rofu_scores_uses_params_instead_of_the_networks_own():
    net, other = make_net(seed=0), make_net(seed=1)
    got = _score(net=net, params=dict(other.named_parameters()))
    want = _score(net=other)
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)
    torch.testing.assert_close(got.bonus, want.bonus, rtol=0, atol=0)


@pytest.mark.parametrize("net", [None, "net", torch.nn.Linear(6, 4)], ids=["None", "str", "Linear"])
def test_rofu_scores_rejects_a_net_that_is_not_a_reward_model(net):
    with pytest.raises(TypeError, match="net must be a RewardModel"):
        rofu_scores(net, _contexts(), make_data(40, 6, 4), CONFIG, torch.Generator())


@pytest.mark.parametrize(
    "contexts",
    [torch.zeros(2, 3, 6, 5), torch.zeros(2, 108), torch.zeros(3, 6, 6), torch.zeros(1, 2, *IMAGE)],
    ids=["narrow image", "flat", "one image unbatched", "5-d"],
)
def test_rofu_scores_rejects_image_contexts_of_another_shape(contexts):
    net = make_conv_net()
    with pytest.raises(ValueError, match=r"^contexts "):
        _score(net=net, contexts=contexts.double(), data=make_data(40, IMAGE, 4))


def test_rofu_scores_rejects_image_data_of_another_shape():
    with pytest.raises(ValueError, match=r"data\.sample\.x must have shape \(3, 6, 6\)"):
        _score(
            net=make_conv_net(), contexts=torch.zeros(2, *IMAGE), data=make_data(40, (3, 5, 5), 4)
        )


# --- gradient modes -------------------------------------------------------------------------


def test_rofu_scores_refuses_inference_mode():
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode"):
        _score()


def test_rofu_scores_works_under_no_grad_and_matches():
    want = _score()
    assert bool((want.bonus > 0).any()), "the case must exercise a non-zero bonus"
    with torch.no_grad():
        got = _score()
    assert torch.is_grad_enabled(), "the caller's mode is restored"
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=0)
    torch.testing.assert_close(got.bonus, want.bonus, rtol=0, atol=0)


def test_rofu_scores_leaves_the_network_and_its_gradients_untouched():
    net = make_net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    scores = _score(net=net)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert all(p.grad is None for p in net.parameters())
    assert not scores.mean.requires_grad
    assert not scores.bonus.requires_grad


# --- special cases --------------------------------------------------------------------------


@pytest.mark.parametrize("form", [{}, {"arm_feature_dim": 3}], ids=["per-arm", "arm-feature"])
def test_rofu_scores_with_zero_steps_is_the_network_with_no_bonus(form):
    net = make_net(**form)
    features = arm_features(4, 3) if form else None
    contexts = _contexts(5)
    scores = _score(net=net, contexts=contexts, config=RofuConfig(steps=0), arm_features=features)
    assert scores.mean.shape == scores.bonus.shape == (5, 4)
    assert bool((scores.bonus == 0).all())
    with torch.no_grad():
        want = net.score_all(contexts, features)
    torch.testing.assert_close(scores.mean, want)
    torch.testing.assert_close(scores.ucb, want)


def test_rofu_scores_candidates_leave_nan_elsewhere():
    candidates = torch.tensor([[True, False, False, True], [False] * 4, [True] * 4])
    scores = _score(candidates=candidates)
    assert torch.equal(scores.mean.isnan(), ~candidates)
    assert torch.equal(scores.bonus.isnan(), ~candidates)
    full = _score()
    torch.testing.assert_close(scores.ucb[candidates], full.ucb[candidates])


def test_rofu_scores_bonus_scale_multiplies_the_bonus():
    base = _score()
    scaled = _score(config=RofuConfig(steps=3, step_size=0.05, minibatch_size=16, bonus_scale=3))
    torch.testing.assert_close(scaled.bonus, 3 * base.bonus)
    torch.testing.assert_close(scaled.mean, base.mean)


# --- regulariser weights --------------------------------------------------------------------


def test_regulariser_weights_dataset_form_is_n_total():
    data = make_data(40, 6, 4, n_total=500)
    weights = regulariser_weights(data, torch.tensor([0, 3, 1]), RofuConfig())
    assert weights.dtype == torch.float64
    assert weights.tolist() == [500.0] * 3


def test_regulariser_weights_arm_count_form_is_pulls_plus_one():
    sample = Transitions(torch.zeros(3, 2), torch.tensor([0, 0, 2]), torch.zeros(3))
    data = RegulariserData(sample, 10, torch.tensor([7, 0, 3]))
    arms = torch.tensor([0, 1, 2, 4, 3, 0])  # arms 3 and 4 arrived after the counts
    weights = regulariser_weights(data, arms, RofuConfig(regulariser="arm_count"))
    assert weights.tolist() == [8.0, 1.0, 4.0, 1.0, 1.0, 8.0]


def _one_row(n_total: int, counts: list[int]) -> RegulariserData:
    sample = Transitions(_contexts(1), torch.tensor([0]), torch.tensor([0.3], dtype=torch.float64))
    return RegulariserData(sample, n_total, torch.tensor(counts))


def test_rofu_scores_arm_count_form_weighs_each_arm_by_its_pulls_plus_one():
    # With w = n_a + 1 an arm's bonus is the dataset form's bonus with |D| = n_a + 1.
    net = make_net(arm_feature_dim=3, hidden=(8,))
    features = arm_features(4, 3)
    contexts = _contexts(2)
    config = RofuConfig(steps=3, step_size=0.1, minibatch_size=None, regulariser="arm_count")
    dataset = RofuConfig(steps=3, step_size=0.1, minibatch_size=None, regulariser="dataset")
    counted = rofu_scores(
        net, contexts, _one_row(5, [4, 1]), config, torch.Generator(), arm_features=features
    )
    assert bool((counted.bonus > 0).all())
    for arm, pulls in [(0, 4), (1, 1), (2, 0), (3, 0)]:  # arms 2 and 3 are new: weight 1
        want = rofu_scores(
            net,
            contexts,
            _one_row(pulls + 1, [pulls + 1]),
            dataset,
            torch.Generator(),
            arm_features=features,
        )
        torch.testing.assert_close(counted.bonus[:, arm], want.bonus[:, arm], rtol=1e-12, atol=0)
    # fewer pulls, smaller weight on the data, larger optimism
    assert bool((counted.bonus[:, 2] > counted.bonus[:, 0]).all())


# --- minibatches ----------------------------------------------------------------------------


def test_minibatch_indices_is_none_when_the_minibatch_covers_the_sample():
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert minibatch_indices(40, RofuConfig(minibatch_size=None), generator) is None
    assert minibatch_indices(40, RofuConfig(minibatch_size=40), generator) is None
    assert minibatch_indices(40, RofuConfig(minibatch_size=41), generator) is None
    assert torch.equal(generator.get_state(), state), "nothing was drawn"


def test_minibatch_indices_draws_steps_by_minibatch_rows_from_the_generator():
    config = RofuConfig(steps=4, minibatch_size=7)
    generator = torch.Generator().manual_seed(3)
    first = minibatch_indices(40, config, generator)
    assert first is not None
    assert first.shape == (4, 7)
    assert first.dtype == torch.int64
    assert bool(((first >= 0) & (first < 40)).all())
    want = torch.randint(40, (4, 7), generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, want)
    second = minibatch_indices(40, config, generator)
    assert second is not None
    assert not torch.equal(first, second), "the generator advanced"
    again = minibatch_indices(40, config, torch.Generator().manual_seed(3))
    assert again is not None
    assert torch.equal(first, again)


def test_rofu_scores_is_deterministic_by_generator_seed():
    first, again, other = _score(seed=5), _score(seed=5), _score(seed=6)
    torch.testing.assert_close(first.bonus, again.bonus, rtol=0, atol=0)
    assert not torch.allclose(first.bonus, other.bonus), "minibatches come from the generator"
    torch.testing.assert_close(first.mean, other.mean, rtol=0, atol=0)


def test_rofu_scores_ignores_the_generator_without_minibatches():
    config = RofuConfig(steps=3, step_size=0.05, minibatch_size=None)
    torch.testing.assert_close(
        _score(config=config, seed=5).bonus, _score(config=config, seed=6).bonus, rtol=0, atol=0
    )


# --- devices --------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", [{}, {"arm_feature_dim": 3}], ids=["per-arm", "arm-feature"])
def test_rofu_scores_on_cuda_equals_cpu(form):
    net = make_net(hidden=(32, 32), dtype=torch.float32, **form)
    data = make_data(300, 6, 4, n_total=2000, dtype=torch.float32)
    features = arm_features(4, 3).float() if form else None
    contexts = _contexts(5).float()
    candidates = torch.rand(5, 4, generator=torch.Generator().manual_seed(2)) > 0.3
    # `drift`: on this unfit network the paper's `start` baseline gives many zero bonuses
    # (the regulariser's pull lowers f), which would leave the bonuses' comparison empty.
    config = RofuConfig(steps=5, step_size=0.05, minibatch_size=64, chunk_size=7, baseline="drift")
    cpu = rofu_scores(
        net,
        contexts,
        data,
        config,
        torch.Generator().manual_seed(0),
        candidates=candidates,
        arm_features=features,
    )
    gpu = rofu_scores(
        net.to("cuda"),
        contexts.cuda(),
        data,
        config,
        torch.Generator().manual_seed(0),
        candidates=candidates.cuda(),
        arm_features=None if features is None else features.cuda(),
    )
    assert gpu.mean.is_cuda
    assert gpu.bonus.is_cuda
    assert bool((cpu.bonus[candidates] > 0).all())
    torch.testing.assert_close(gpu.mean.cpu(), cpu.mean, rtol=1e-4, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(gpu.bonus.cpu(), cpu.bonus, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("baseline", ["start", "drift"])
def test_naive_reference_on_cuda_equals_batched_on_cpu(baseline):
    # The kernel benchmark times the naive loop on the GPU too.
    net = make_net(hidden=(8,), dtype=torch.float32)
    data = make_data(60, 6, 4, dtype=torch.float32)
    contexts = _contexts(3).float()
    config = RofuConfig(steps=3, step_size=0.05, minibatch_size=16, baseline=baseline)
    cpu = rofu_scores(net, contexts, data, config, torch.Generator().manual_seed(0))
    on_gpu = RegulariserData(data.sample.to("cuda"), data.n_total, data.arm_counts)
    naive = rofu_scores_naive(
        net.to("cuda"), contexts.cuda(), on_gpu, config, torch.Generator().manual_seed(0)
    )
    assert bool((cpu.bonus > 0).any())
    torch.testing.assert_close(naive.mean.cpu(), cpu.mean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(naive.bonus.cpu(), cpu.bonus, rtol=1e-4, atol=1e-4)
