"""The paper's ablation (section 5.1) in the replay: the ResNet bandit, learners, the bonus
each run records, the `ablation` protocol's jobs, and its report end to end."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import rofu.replay.simulation.datasets as datasets
import rofu.replay.simulation.learners as learners
from rofu.models import FitConfig, ResNet, RewardNet
from rofu.models.policies import EpsilonGreedy, Greedy, RofuPolicy, TrainSchedule
from rofu.replay.cli import main
from rofu.replay.runner import PROTOCOLS, Job, job_policy, jobs_for
from rofu.replay.simulation.bandits import PoolBandit, ResNetBandit
from rofu.replay.simulation.policies import build_policy, learner_variant
from rofu.replay.simulation.simulate import WARM_START, RunResult, simulate

CPU = torch.device("cpu")


def test_resnet_bandit_shapes_noise_and_reproducibility_by_seed() -> None:
    bandit = ResNetBandit(width=4)
    assert (bandit.context_shape, bandit.context_dim, bandit.n_arms) == ((3, 32, 32), 3072, 10)
    stream = bandit.stream(400, 0)
    assert stream.contexts.shape == (400, 3, 32, 32)
    assert stream.rewards.shape == stream.means.shape == (400, 10)
    assert -1 <= stream.contexts.min() < stream.contexts.max() <= 1
    again, other = bandit.stream(400, 0), bandit.stream(400, 1)
    for field in ("contexts", "rewards", "means"):
        np.testing.assert_array_equal(getattr(stream, field), getattr(again, field))
    assert not np.allclose(stream.means, other.means)
    np.testing.assert_allclose((stream.rewards - stream.means).std(), 0.5, rtol=0.05)
    # calibrated batch norm keeps the random simulator's rewards at a unit scale
    assert 0.3 < stream.means.std() < 5
    assert "RANDOM ResNet-20" in bandit.notes


def test_resnet_simulator_is_a_seeded_resnet_20() -> None:
    bandit = ResNetBandit(width=2)
    net = bandit.simulator(3)
    assert isinstance(net, ResNet)
    assert (net.config.depth, net.config.width, net.training) == (20, 2, False)
    first, again = bandit.simulator(3), bandit.simulator(4)
    assert net.config.seed == first.config.seed != again.config.seed


def test_registry_names_both_ablation_bandits_as_synthetic() -> None:
    for name in PROTOCOLS["ablation"].datasets:
        assert datasets.DATASETS[name].synthetic
    assert isinstance(datasets.load_bandit("resnet"), ResNetBandit)


def test_ablation_protocol_runs_rofu_at_three_m_against_epsilon_greedy_and_greedy() -> None:
    protocol = PROTOCOLS["ablation"]
    assert protocol.datasets == ("mlp", "resnet")
    assert protocol.policies == (
        "ROFU@steps=1",
        "ROFU@steps=5",
        "ROFU@steps=10",
        "EpsilonGreedy",
        "Greedy",
    )
    jobs = jobs_for(protocol.datasets, protocol.policies, (0, 1), 100, None, protocol.learners)
    assert len(jobs) == 2 * 2 * 5
    assert {(job.bandit, job.learner) for job in jobs} == {
        ("mlp", "paper-mlp"),
        ("resnet", "paper-resnet32"),
    }
    job = Job("resnet", "ROFU@steps=10", 1, 100, learner="paper-resnet32")
    assert job.path(Path("out")) == Path(
        "out/runs/resnet/ROFU@steps=10/seed1-T100-paper-resnet32.json"
    )


def test_policies_on_the_ablation_learners_follow_the_bandit() -> None:
    cases = {
        ("mlp", "paper-mlp"): (RewardNet, (10,)),
        ("resnet", "paper-resnet32"): (ResNet, (3, 32, 32)),
    }
    for (bandit_name, learner_name), (model, shape) in cases.items():
        bandit = datasets.load_bandit(bandit_name)
        learner = learners.get_learner(learner_name)
        for name, kind in (
            ("ROFU@steps=10", RofuPolicy),
            ("EpsilonGreedy", EpsilonGreedy),
            ("Greedy", Greedy),
        ):
            job = Job(bandit_name, name, 2, 50, learner=learner_name)
            policy, config = job_policy(job, bandit, CPU)
            assert type(policy) is kind
            assert isinstance(policy.net, model)
            assert (policy.context_shape, policy.net.config.seed) == (shape, 2)
            assert policy.schedule == learner.schedule
            assert config["net"]["model"] == model.__name__
            assert config["preset"]["name"].startswith(learner_name)
        rofu = build_policy("ROFU@steps=10", 0, 10, 0, CPU, learner=learner)
        assert isinstance(rofu, RofuPolicy)
        assert rofu.rofu == dataclasses.replace(learner.rofu, steps=10)
        greedy = build_policy("EpsilonGreedy", 0, 10, 0, CPU, learner=learner)
        assert isinstance(greedy, EpsilonGreedy)
        assert greedy.epsilon == learner.epsilon == 0.1
    resnet = learners.get_learner("paper-resnet32")
    assert (resnet.net.depth, resnet.rofu.estimator) == (32, "ntk")
    assert learners.get_learner("paper-mlp").net.hidden == (100, 100)  # a 3-layer MLP


def test_a_learner_refuses_other_policies_presets_and_shapes() -> None:
    learner = learners.get_learner("paper-resnet32")
    with pytest.raises(ValueError, match="NeuralUCB does not run on a data set with a learner"):
        build_policy("NeuralUCB", 0, 10, 0, CPU, learner=learner)
    with pytest.raises(ValueError, match="hidden: no such setting"):
        learner_variant("ROFU@hidden=8", learner)
    with pytest.raises(ValueError, match="is fixed for this data set"):
        learner_variant("ROFU@learner=showdown", learner)
    with pytest.raises(ValueError, match="unknown learner"):
        learners.get_learner("nope")
    with pytest.raises(ValueError, match="learner paper-resnet32 takes contexts"):
        learner.check("mlp", (10,), 10)
    with pytest.raises(ValueError, match="a preset does not apply"):
        job_policy(
            Job("mlp", "ROFU", 0, 5, "linear", "paper-mlp"), datasets.load_bandit("mlp"), CPU
        )
    mlp = learner_variant("ROFU@steps=1+hidden=8x8+fit_lr=0.01", learners.get_learner("paper-mlp"))
    assert (mlp.name, mlp.net.hidden, mlp.rofu.steps) == (
        "paper-mlp+steps=1+hidden=8x8+fit_lr=0.01",
        (8, 8),
        1,
    )
    assert mlp.schedule.fit.lr == 0.01


def _toy() -> PoolBandit:
    contexts = np.eye(3)[np.arange(6) % 3] + 0.1
    return PoolBandit("toy", contexts, np.eye(3)[np.arange(6) % 3])


def test_simulate_records_the_bonus_of_the_chosen_arm(tmp_path) -> None:
    stream = _toy().stream(30, 0)
    rofu = build_policy("ROFU", 3, 3, 0, CPU)
    run = simulate(rofu, stream, bandit="toy", policy_name="ROFU")
    assert run.bonus is not None
    assert run.bonus.shape == (30,)
    warm = WARM_START * 3
    assert np.isnan(run.bonus[:warm]).all()
    assert (run.bonus[warm:] >= 0).all()  # finite too: NaN >= 0 is False
    assert (run.bonus[warm:] > 0).any()
    greedy = simulate(build_policy("Greedy", 3, 3, 0, CPU), stream)
    assert greedy.bonus is not None
    np.testing.assert_array_equal(greedy.bonus[warm:], 0.0)
    path = tmp_path / "r.npz"
    run.save(path)
    loaded = RunResult.load(path)
    assert loaded.bonus is not None
    np.testing.assert_array_equal(loaded.bonus, run.bonus)
    older = dataclasses.replace(run, bonus=None)  # files written before bonuses were recorded
    older.save(path)
    assert RunResult.load(path).bonus is None


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny convolutions thrash with a second thread when another process holds a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_ablation_end_to_end_writes_regret_and_bonus_curves(tmp_path, monkeypatch, capsys) -> None:
    """The one command on learners and a simulator shrunk to run in seconds."""
    tiny = TrainSchedule(every=5, fit=FitConfig(steps=1, batch_size=8, lr=1e-2), persist=True)
    mlp, resnet = learners.get_learner("paper-mlp"), learners.get_learner("paper-resnet32")
    small_mlp = dataclasses.replace(mlp.net, hidden=(8,))
    small_resnet = dataclasses.replace(resnet.net, depth=8, width=1)
    small_rofu = dataclasses.replace(resnet.rofu, minibatch_size=4)
    for learner, net, rofu in ((mlp, small_mlp, mlp.rofu), (resnet, small_resnet, small_rofu)):
        shrunk = dataclasses.replace(learner, net=net, rofu=rofu, schedule=tiny)
        monkeypatch.setitem(learners.LEARNERS, learner.name, shrunk)
    simulator = ResNetBandit(depth=8, width=1, calibration=16)
    monkeypatch.setitem(datasets.DATASETS, "resnet", datasets.Dataset(lambda folder: simulator))
    out = tmp_path / "ablation"
    argv = ["--protocol", "ablation", "--rounds", "34", "--seeds", "0", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    runs = sorted((out / "runs").glob("*/*/*.json"))
    assert len(runs) == 2 * 5
    assert {p.name for p in runs} == {"seed0-T34-paper-mlp.json", "seed0-T34-paper-resnet32.json"}
    assert len(sorted((out / "cache").glob("*/*/*.npz"))) == 2 * 5  # the full arrays, ignored
    readme = (out / "README.md").read_text()
    for bandit in ("mlp", "resnet"):
        assert (out / "plots" / f"regret-{bandit}.png").stat().st_size > 1000
        assert (out / "plots" / f"bonus-{bandit}.png").stat().st_size > 1000
        assert f"![bonus-{bandit}](plots/bonus-{bandit}.png)" in readme
    assert "## Bonus curves" in readme
    assert "| resnet | ROFU@steps=10 |" in readme
    assert "| mlp | Greedy |" not in readme  # a policy without a bonus has no curve
    assert "RANDOM ResNet-8" in readme
    assert "learner `paper-resnet32`" in readme
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*argv, "--preset", "linear"])
    assert "a preset does not apply" in capsys.readouterr().err
