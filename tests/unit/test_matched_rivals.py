"""SquareCB-matched and NeuralLinUCB-matched: ROFU's learner, another way to explore."""

from __future__ import annotations

import math

import pytest
import torch

from rofu.models import Transitions
from rofu.models.policies import (
    Greedy,
    NeuralLinUCB,
    NeuralLinUCBParams,
    SquareCB,
    SquareCBParams,
    TrainSchedule,
)
from rofu.models.presets import PRODUCT, get_preset
from rofu.replay.cli import main
from rofu.replay.runner import PROTOCOLS, jobs_for
from rofu.replay.simulation.policies import (
    KNOWN,
    PRESET_POLICIES,
    build_policy,
    canonical_policy_name,
    resolve_preset,
)

CPU = torch.device("cpu")
RIVALS = ("SquareCB-matched", "NeuralLinUCB-matched")
D, A = 4, 3


def _rows(n: int, seed: int = 0) -> Transitions:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=generator)
    arms = torch.arange(n) % A
    rewards = (
        x[:, 0] * (arms == 0) + x[:, 1] * (arms == 1) + 0.1 * torch.randn(n, generator=generator)
    )
    return Transitions(x, arms, rewards)


def _feed(policy: object, rows: Transitions) -> None:
    for i in range(len(rows)):
        policy.update(Transitions(rows.x[i : i + 1], rows.arms[i : i + 1], rows.rewards[i : i + 1]))  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", RIVALS)
def test_matched_rival_fits_the_same_network_as_greedy_matched(name: str) -> None:
    greedy = build_policy("Greedy-matched", D, A, 3, CPU)
    rival = build_policy(name, D, A, 3, CPU)
    assert type(rival.net) is type(greedy.net)  # type: ignore[attr-defined]
    assert rival.schedule == greedy.schedule == PRODUCT.schedule  # type: ignore[attr-defined]
    rows = _rows(25)
    for policy in (greedy, rival):
        policy.select(rows.x[:2])  # its draws must not touch the fit
        _feed(policy, rows)
    mine, theirs = rival.net.state_dict(), greedy.net.state_dict()  # type: ignore[attr-defined]
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def test_matched_rivals_take_the_preset_like_greedy_matched() -> None:
    preset = get_preset("small-lr")
    for name in RIVALS:
        assert name in PRESET_POLICIES
        assert resolve_preset(name, preset) == preset
        built = build_policy(name, D, A, 0, CPU, preset=preset)
        assert built.schedule == preset.schedule  # type: ignore[attr-defined]
    paper = PROTOCOLS["paper"]
    jobs = jobs_for(paper.datasets[:1], RIVALS, [0], 20, {paper.datasets[0]: "small-lr"})
    assert {job.preset for job in jobs} == {"small-lr"}


def test_squarecb_probabilities_are_the_igw_formula() -> None:
    policy = SquareCB(PRODUCT.net(D, A, 1), PRODUCT.schedule, SquareCBParams(gamma0=0.5), seed=1)
    _feed(policy, _rows(12))
    contexts = _rows(5, seed=9).x
    decision = policy.select(contexts)
    mean = policy.predict(contexts).double()
    gamma = 0.5 * math.sqrt(A * 12)
    assert policy.gamma == pytest.approx(gamma)
    assert decision.probabilities is not None
    for row in range(5):
        best = int(mean[row].argmax())
        want = [1.0 / (A + gamma * float(mean[row, best] - mean[row, a])) for a in range(A)]
        want[best] = 1.0 - (sum(want) - want[best])
        assert decision.probabilities[row].tolist() == pytest.approx(want, rel=1e-9)
        arm = int(decision.arms[row])
        assert float(decision.propensity[row]) == pytest.approx(want[arm], rel=1e-9)
    assert torch.equal(decision.scores.bonus, torch.zeros(5, A, dtype=torch.float64))


def test_squarecb_with_gamma_zero_is_uniform() -> None:
    policy = SquareCB(PRODUCT.net(D, A, 1), PRODUCT.schedule, SquareCBParams(gamma0=0.0))
    decision = policy.select(_rows(4).x)
    assert decision.probabilities is not None
    assert torch.allclose(decision.probabilities, torch.full((4, A), 1 / A, dtype=torch.float64))


def test_neural_linucb_bonus_is_the_ridge_width_on_the_last_hidden_layer() -> None:
    params = NeuralLinUCBParams(alpha=2.0, ridge=0.5)
    policy = NeuralLinUCB(PRODUCT.net(D, A, 2), PRODUCT.schedule, params, seed=2)
    rows = _rows(15)
    _feed(policy, rows)
    contexts = _rows(3, seed=5).x
    scores = policy.scores(contexts)
    phi = policy.features(rows.x, rows.arms)  # (N, H), the current network's
    z = policy.features(contexts, torch.zeros(3, dtype=torch.long))
    for arm in range(A):
        own = phi[rows.arms == arm]
        gram = 0.5 * torch.eye(phi.shape[1], dtype=torch.float64) + own.T @ own
        want = 2.0 * torch.einsum("bi,ij,bj->b", z, torch.linalg.inv(gram), z).sqrt()
        assert torch.allclose(scores.bonus[:, arm], want, rtol=1e-6)
    assert torch.allclose(scores.mean, policy.predict(contexts).double())
    decision = policy.select(contexts)
    assert torch.equal(decision.propensity, torch.ones(3, dtype=torch.float64))


def test_neural_linucb_bonus_is_positive_and_shrinks_with_the_arms_data() -> None:
    never = TrainSchedule(every=10_000)  # fixed features: A_a only grows
    policy = NeuralLinUCB(PRODUCT.net(D, A, 0), never, seed=0)
    context = _rows(1, seed=7).x
    before = policy.scores(context).bonus[0]
    assert bool((before > 0).all())
    rows = _rows(30)
    zero = rows.arms == 0
    _feed(policy, Transitions(rows.x[zero], rows.arms[zero], rows.rewards[zero]))
    after = policy.scores(context).bonus[0]
    assert 0 < float(after[0]) < float(before[0])
    assert torch.allclose(after[1:], before[1:])  # the other arms have no rows
    _feed(policy, Transitions(rows.x[~zero], rows.arms[~zero], rows.rewards[~zero]))
    assert float(policy.scores(context).bonus[0][1]) < float(after[1])


def test_neural_linucb_with_alpha_zero_decides_as_greedy() -> None:
    net, schedule = PRODUCT.net(D, A, 4), PRODUCT.schedule
    rival = NeuralLinUCB(net, schedule, NeuralLinUCBParams(alpha=0.0), seed=4)
    greedy = Greedy(net, schedule, seed=4)
    _feed(rival, _rows(10))
    _feed(greedy, _rows(10))
    contexts = _rows(6, seed=3).x
    assert torch.equal(rival.select(contexts).arms, greedy.select(contexts).arms)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (lambda: SquareCBParams(gamma0=-1.0), "gamma0"),
        (lambda: NeuralLinUCBParams(ridge=0.0), "ridge"),
        (lambda: NeuralLinUCBParams(alpha=-0.1), "alpha"),
    ],
)
def test_rival_params_name_the_bad_argument(params, message) -> None:
    with pytest.raises(ValueError, match=message):
        params()


def test_rival_names_are_known_and_unknown_ones_are_usage_errors(capsys) -> None:
    assert canonical_policy_name("squarecb-matched") == "SquareCB-matched"
    assert canonical_policy_name("NEURALLINUCB-MATCHED") == "NeuralLinUCB-matched"
    assert all(name in KNOWN for name in RIVALS)
    with pytest.raises(ValueError, match="unknown policy 'SquareCB-matched@gamma0=1'"):
        canonical_policy_name("SquareCB-matched@gamma0=1")
    with pytest.raises(SystemExit) as exc:
        main(["--policies", "SquareCB-mached", "--rounds", "10", "--report-only"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown policy 'SquareCB-mached'" in err
    assert "SquareCB-matched" in err
    assert "NeuralLinUCB-matched" in err
