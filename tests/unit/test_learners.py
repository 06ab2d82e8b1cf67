"""The learner family: candidates scored prequentially on the same rows, the best served."""

from __future__ import annotations

import pytest
import torch

from rofu.models import FitConfig, RewardNetConfig, RofuConfig, Transitions
from rofu.models.learners import Candidate, LearnerFamily, default_candidates
from rofu.models.policies import RofuPolicy
from rofu.models.training import TrainSchedule

NET = RewardNetConfig(context_dim=4, n_arms=2, hidden=(32, 32), seed=1)
EAGER = FitConfig(steps=30, batch_size=256, lr=1e-2)  # many steps on few rows: overfits
LINEAR = RewardNetConfig(context_dim=4, n_arms=2, hidden=(), seed=1)


def _stream(truth, rows: int, seed: int) -> list[Transitions]:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(rows // 5):
        x = torch.randn(5, 4, generator=generator)
        arms = torch.randint(2, (5,), generator=generator)
        noise = 0.5 * torch.randn(5, generator=generator)
        batches.append(Transitions(x, arms, truth(x, arms) + noise))
    return batches


def _served(truth, rows: int = 150) -> tuple[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    family = LearnerFamily(
        [Candidate("mlp", NET, EAGER), Candidate("linear", LINEAR, FitConfig(steps=30, lr=1e-2))]
    )
    generator, seen = torch.Generator().manual_seed(0), []
    for batch in _stream(truth, rows, seed=2):
        family.observe(batch, None)
        seen.append(batch)
        if len(seen) % 2 == 0:
            family.fit(Transitions.concat(seen), generator)
    return family.served, family.record()


def test_family_serves_the_linear_model_where_the_truth_is_linear() -> None:
    served, record = _served(lambda x, a: x[:, 0] * (2 * a - 1) + 0.5 * x[:, 1], rows=150)
    assert served == "linear"
    assert record["loss/linear"] < record["loss/mlp"]


def test_family_serves_the_mlp_where_the_truth_is_not_linear() -> None:
    served, record = _served(lambda x, a: 3 * (x[:, 0] * x[:, 1]).abs() * (2 * a - 1), rows=400)
    assert served == "mlp"
    assert record["served"] == 0.0


def test_family_scores_rows_before_it_refits_on_them() -> None:
    family = LearnerFamily(default_candidates(RewardNetConfig(context_dim=4, n_arms=2), EAGER))
    batch = _stream(lambda x, a: x[:, 0], 5, seed=4)[0]
    with torch.no_grad():
        before = {
            n: (net(batch.x, batch.arms) - batch.rewards).square() for n, net in family.nets.items()
        }
    family.observe(batch, None)
    family.fit(batch, torch.Generator().manual_seed(0))
    for name, squared in before.items():
        expected = sum(0.999 ** (4 - i) * float(v) for i, v in enumerate(squared))
        weight = sum(0.999 ** (4 - i) for i in range(5))
        assert family.losses[name].variance == pytest.approx(expected / weight, rel=1e-5)


def test_family_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="distinct"):
        LearnerFamily([Candidate("a", NET, EAGER), Candidate("a", LINEAR, EAGER)])


def test_rofu_policy_serves_the_family_choice() -> None:
    schedule = TrainSchedule(every=5, fit=FitConfig(steps=5), family=True)
    config = RofuConfig(estimator="ntk-closed", l2=0.01, noise="prequential")
    policy = RofuPolicy(RewardNetConfig(context_dim=4, n_arms=2, hidden=(8,)), schedule, config)
    for batch in _stream(lambda x, a: x[:, 0], 30, seed=5):
        metrics = policy.update(batch)
    assert policy.family is not None
    assert policy.net is policy.family.served_net
    assert {"loss/mlp", "loss/sgd-decay", "loss/linear", "served"} <= set(metrics)
    assert policy.buffer.noise == policy.family.losses[policy.family.served]
    assert policy.scores(torch.zeros(1, 4)).bonus.shape == (1, 2)


def test_a_diverging_candidate_starts_again_and_the_others_are_served() -> None:
    """SGD at a step far past its stability diverges on its first refit: that candidate
    starts again from its initial network with no loss, the family stays finite, the MLP
    is served, and the reset is counted; the rows keep being scored."""
    wild = FitConfig(steps=30, batch_size=256, optimizer="sgd", lr=1e6)
    family = LearnerFamily([Candidate("mlp", NET, EAGER), Candidate("wild", NET, wild)])
    initial = {k: v.clone() for k, v in family.nets["wild"].state_dict().items()}
    generator, seen = torch.Generator().manual_seed(0), []
    for batch in _stream(lambda x, a: 5 * x[:, 0], 20, seed=3):
        family.observe(batch, None)
        seen.append(batch)
        record = family.fit(Transitions.concat(seen), generator)
        assert family.all_finite()
        assert family.served == "mlp"
    assert family.resets == {"mlp": 0, "wild": 4}
    assert record["resets/wild"] == 4.0
    assert "resets/mlp" not in record
    assert family.losses["wild"].variance is None  # reset after its last refit
    assert all(torch.equal(v, initial[k]) for k, v in family.nets["wild"].state_dict().items())


def test_a_candidate_whose_predictions_overflow_starts_again_when_it_scores() -> None:
    family = LearnerFamily([Candidate("mlp", NET, EAGER), Candidate("other", NET, EAGER)])
    with torch.no_grad():
        for p in family.nets["other"].parameters():
            p.fill_(1e30)  # finite parameters, infinite outputs
    batch = _stream(lambda x, a: x[:, 0], 5, seed=4)[0]
    family.observe(batch, None)
    assert family.resets["other"] == 1
    assert family.losses["other"].variance is None
    assert family.losses["mlp"].variance is not None
    assert family.served == "mlp"


def test_a_replay_run_records_the_rounds_each_candidate_served_and_its_resets(tmp_path) -> None:
    import numpy as np

    from rofu.replay.simulation.bandits import Stream
    from rofu.replay.simulation.simulate import RunResult, simulate
    from rofu.replay.simulation.summary import RunSummary

    rng = np.random.default_rng(0)
    contexts = rng.normal(size=(40, 4)).astype(np.float32)
    means = np.stack([contexts[:, 0], -contexts[:, 0]], axis=1).astype(np.float64)
    schedule = TrainSchedule(every=5, fit=FitConfig(steps=5), family=True)
    config = RofuConfig(estimator="ntk-closed", l2=0.01, noise="prequential")
    policy = RofuPolicy(RewardNetConfig(context_dim=4, n_arms=2, hidden=(8,)), schedule, config)
    run = simulate(policy, Stream(contexts, means, means), policy_name="ROFU@family=1")
    assert run.learners is not None
    assert policy.family is not None
    served = run.learners["served_rounds"]
    assert set(served) == {"mlp", "sgd-decay", "linear"}
    assert sum(served.values()) == 40 - 3 * 2  # every round after the warm start
    assert run.learners["resets"] == policy.family.resets
    run.save(tmp_path / "run.npz")
    assert RunResult.load(tmp_path / "run.npz").learners == run.learners
    summary = RunSummary.of(run, {})
    summary.save(tmp_path / "run.json")
    assert RunSummary.load(tmp_path / "run.json").learners == run.learners
    alone = TrainSchedule(every=5, fit=FitConfig(steps=5))
    plain = RofuPolicy(RewardNetConfig(context_dim=4, n_arms=2, hidden=(8,)), alone)
    assert simulate(plain, Stream(contexts[:10], means[:10], means[:10])).learners is None
