"""The replay records the ascent step each ROFU round was scored with, and the report says
how often the stability cap cut it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rofu.replay.reports.bonus import step_table
from rofu.replay.simulation.bandits import PoolBandit
from rofu.replay.simulation.policies import build_policy
from rofu.replay.simulation.simulate import WARM_START, RunResult, simulate
from rofu.replay.simulation.summary import RunSummary

CPU = torch.device("cpu")


def _toy() -> PoolBandit:
    contexts = np.eye(3)[np.arange(6) % 3] + 0.1
    return PoolBandit("toy", contexts, np.eye(3)[np.arange(6) % 3])


def test_simulate_records_the_step_the_cap_resolved_each_round(tmp_path) -> None:
    stream = _toy().stream(40, 0)
    warm = WARM_START * 3
    capped = build_policy("ROFU@cap=0.001", 3, 3, 0, CPU)
    run = simulate(capped, stream, policy_name="ROFU@cap=0.001")
    assert run.ascent_step is not None
    assert np.isnan(run.ascent_step[:warm]).all()
    set_step = capped.rofu.step_size
    assert (run.ascent_step[warm:] < set_step).all()  # every checkpoint's rho is past 0.001
    assert (run.ascent_step[warm:] > 0).all()
    assert len(np.unique(run.ascent_step[warm:])) > 1  # resolved per checkpoint, not once

    fixed = simulate(build_policy("ROFU@cap=none", 3, 3, 0, CPU), stream)
    assert fixed.ascent_step is not None
    np.testing.assert_array_equal(fixed.ascent_step[warm:], set_step)
    assert simulate(build_policy("Greedy", 3, 3, 0, CPU), stream).ascent_step is None

    path = tmp_path / "r.npz"
    run.save(path)
    loaded = RunResult.load(path).ascent_step
    assert loaded is not None
    np.testing.assert_array_equal(loaded, run.ascent_step)
    dataclasses.replace(run, ascent_step=None).save(path)  # a file from before it was recorded
    assert RunResult.load(path).ascent_step is None


def _run(policy: str, steps: list[float] | None, set_step: float = 0.01) -> RunSummary:
    arms = np.zeros(len(steps or [0]), dtype=np.int64)
    config = {"params": {"step_size": set_step}}
    recorded = None if steps is None else np.array([np.nan, *steps])
    run = RunResult(
        "toy", policy, 0, arms, arms * 0.0, arms * 0.0, 1.0, config, ascent_step=recorded
    )
    return RunSummary.of(run, {})


def test_step_table_counts_the_capped_rounds_and_their_cut() -> None:
    runs = [_run("ROFU", [0.01, 0.005, 0.0025, 0.01]), _run("ROFU", None)]
    table = step_table({"toy": {"ROFU": runs, "Greedy": [_run("Greedy", None)]}})
    assert "| toy | ROFU | 1 of 2 | 0.01 | 50.0% | 0.375 | 0.25 |" in table
    assert "Greedy" not in table
    uncut = step_table({"toy": {"ROFU": [_run("ROFU", [0.01, 0.01])]}})
    assert "| toy | ROFU | 1 of 1 | 0.01 | 0.0% | - | - |" in uncut
    assert step_table({"toy": {"Greedy": [_run("Greedy", None)]}}) == ""
