"""Regret II (the ROFU paper's metric): the oracle, the runs' summaries and the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rofu.replay.runner as runner
import rofu.replay.simulation.oracle as oracle
from rofu.models.networks import RewardNet, RewardNetConfig
from rofu.replay.reports.report import write_report
from rofu.replay.reports.table import REGRET2_HEADING, markdown, summarise
from rofu.replay.runner import Job, jobs_for, run_jobs
from rofu.replay.simulation.bandits import MLPBandit, PoolBandit, Stream
from rofu.replay.simulation.oracle import OracleConfig, oracle_for, regret_two, train_oracle
from rofu.replay.simulation.summary import RunSummary

TINY = OracleConfig(hidden=(8,), steps=200, batch_size=16, lr=1e-2)


def _toy() -> PoolBandit:
    contexts = np.eye(3)[np.arange(6) % 3] + 0.1
    return PoolBandit("toy", contexts, np.eye(3)[np.arange(6) % 3])


def test_regret_two_on_a_tiny_bandit_equals_the_hand_computation() -> None:
    net = RewardNet(RewardNetConfig(context_dim=2, n_arms=3, hidden=()))
    with torch.no_grad():  # f*(x, a) = x . w_a: arm 0 scores x0, arm 1 x1, arm 2 0.5
        net.layers[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
        net.layers[0].bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    contexts = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    means = np.array([[0.2, 0.9, 0.4], [0.1, 0.6, 0.3], [0.5, 0.5, 0.7]])
    stream = Stream(contexts, means.copy(), means)
    arms = np.array([1, 1, 0])
    # the oracle picks arm 0, arm 1, arm 2: mu(a') - mu(a_t) = 0.2-0.9, 0.6-0.6, 0.7-0.5
    np.testing.assert_allclose(regret_two(net, stream, arms), [-0.7, 0.0, 0.2])


def test_the_oracle_is_deterministic_and_learns_the_pool() -> None:
    bandit = _toy()
    one, two = (train_oracle(bandit.contexts, bandit.means, TINY) for _ in range(2))
    for (key, mine), theirs in zip(
        one.state_dict().items(), two.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), key
    predicted = one.score_all(torch.from_numpy(bandit.contexts)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(predicted, bandit.means.argmax(axis=1))


def test_a_generated_bandit_trains_on_its_stream_and_images_get_none(tmp_path) -> None:
    bandit = MLPBandit(context_dim=3, n_arms=2, hidden=4)
    stream = bandit.stream(20, 5)
    net = oracle_for(bandit, stream, 5, TINY, tmp_path)
    assert net is not None
    assert [p.name for p in tmp_path.iterdir()] == [f"mlp-seed5-T20-{TINY.tag}.safetensors"]

    class Image(MLPBandit):
        context_shape = (1, 2, 2)

    assert oracle_for(Image(), stream, 5, TINY, tmp_path) is None


def test_runs_record_regret_two_and_reuse_the_cached_oracle(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _toy())
    jobs = jobs_for(["toy"], ["Uniform", "LinUCB"], [0, 1], rounds=40)
    run_jobs(jobs[:1], tmp_path, progress=False, oracle=TINY)
    cached = list((tmp_path / "cache" / "oracle").iterdir())
    assert [p.name for p in cached] == [f"toy-{TINY.tag}.safetensors"]  # one per pool

    def never(*args: object, **kwargs: object) -> RewardNet:
        raise AssertionError("the oracle was trained again")

    monkeypatch.setattr(oracle, "train_oracle", never)
    run_jobs(jobs, tmp_path, progress=False, oracle=TINY)
    for job in jobs:
        summary = RunSummary.load(job.path(tmp_path))
        full = runner.RunResult.load(job.cache_path(tmp_path))
        assert full.regret2 is not None
        assert summary.final_regret2 == pytest.approx(float(full.regret2.sum()))
        assert summary.regret2_curve is not None
        assert len(summary.regret2_curve) == 40
        assert summary.regret2_curve[-1] == pytest.approx(summary.final_regret2, rel=1e-3)
    # the toy oracle is exact: regret II is the pseudo-regret
    assert summary.final_regret2 == pytest.approx(summary.final_pseudo_regret)


def _strip_regret_two(path: Path) -> None:
    """The summary as a run made before regret II was recorded wrote it."""
    record = json.loads(path.read_text())
    del record["final_regret2"], record["regret2_curve"]
    path.write_text(json.dumps(record))


def test_report_shows_regret_two_where_every_run_has_it_and_na_elsewhere(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _toy())
    jobs = jobs_for(["toy"], ["Uniform", "LinUCB"], [0, 1], rounds=30)
    run_jobs(jobs, tmp_path, progress=False, oracle=TINY)
    old = Job("toy", "LinUCB", 1, 30).path(tmp_path)
    _strip_regret_two(old)
    assert RunSummary.load(old).final_regret2 is None  # an older summary still loads
    text = write_report(tmp_path, "toy").read_text()
    assert REGRET2_HEADING in text
    finals = [RunSummary.load(job.path(tmp_path)).final_regret2 for job in jobs[::2]]
    mean = float(np.mean([f for f in finals if f is not None]))
    assert f"| Uniform | {mean:.1f} +- " in text
    assert "| LinUCB | n/a |" in text  # one of its seeds has none
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["cells"]["toy"]["LinUCB"]["regret2_mean"] is None


def test_report_without_any_regret_two_has_no_such_table(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _toy())
    jobs = jobs_for(["toy"], ["Uniform"], [0], rounds=20)
    run_jobs(jobs, tmp_path, progress=False, oracle=None)
    summary = RunSummary.load(jobs[0].path(tmp_path))
    assert (summary.final_regret2, summary.regret2_curve) == (None, None)
    table = summarise({"toy": {"Uniform": [summary]}})
    assert REGRET2_HEADING not in markdown(table, "toy")


def test_oracle_recipe_errors_name_the_setting() -> None:
    with pytest.raises(ValueError, match="steps"):
        OracleConfig(steps=0)
    with pytest.raises(ValueError, match="lr"):
        OracleConfig(lr=0.0)
