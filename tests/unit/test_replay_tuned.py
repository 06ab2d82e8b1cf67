"""ROFU-tuned: ROFU on each data set's tuned preset, beside ROFU on one preset, in a table
of its own (`rofu.replay.reports.tuned`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rofu.models.presets import get_preset
from rofu.replay.cli import main
from rofu.replay.reports.table import summarise
from rofu.replay.reports.tuned import section, split
from rofu.replay.runner import jobs_for
from rofu.replay.simulation import policies
from rofu.replay.simulation.policies import (
    BUILT_IN,
    TUNED_POLICY,
    build_policy,
    canonical_policy_name,
)
from rofu.replay.simulation.simulate import RunResult
from rofu.replay.simulation.summary import RunSummary


def test_rofu_tuned_runs_only_where_its_preset_differs_from_rofus():
    jobs = jobs_for(
        ["statlog", "jester", "covertype", "mushroom", "mlp"],
        ["ROFU", TUNED_POLICY],
        [0, 1],
        100,
        presets={"mushroom": "small-lr"},
        learners={"mlp": "paper-mlp"},
    )
    tuned = [(j.seed, j.bandit, j.preset) for j in jobs if j.policy == TUNED_POLICY]
    # statlog has no tuned preset, mushroom's is the one ROFU runs, mlp runs its learner
    assert tuned == [
        (0, "jester", "linear"),
        (0, "covertype", "sgd-decay"),
        (1, "jester", "linear"),
        (1, "covertype", "sgd-decay"),
    ]
    rofu = {(j.bandit, j.preset) for j in jobs if j.policy == "ROFU"}
    assert ("mushroom", "small-lr") in rofu
    assert ("jester", "product") in rofu
    everywhere = jobs_for(["jester"], [TUNED_POLICY], [0], 100, presets={"jester": "linear"})
    assert everywhere == []  # ROFU runs the tuned preset itself: nothing to add


def test_rofu_tuned_is_named_not_run_by_default_and_builds_its_preset():
    assert canonical_policy_name("rofu-tuned") == TUNED_POLICY
    assert TUNED_POLICY not in BUILT_IN
    linear = get_preset("linear")
    policy = build_policy(TUNED_POLICY, 4, 3, 0, torch.device("cpu"), preset=linear)
    assert policy.net.config.activation == "identity"
    record = policies.configuration(policy, policies.resolve_preset(TUNED_POLICY, linear))
    assert record["preset"]["name"] == "linear"


def _run(bandit: str, policy: str, seed: int, final: float, preset: str = "") -> RunSummary:
    config = {"preset": {"name": preset}} if preset else None
    regret = np.array([final, 0.0])
    run = RunResult(bandit, policy, seed, np.zeros(2, dtype=np.int64), regret, regret, 2.0, config)
    return RunSummary.of(run, {})


def _results() -> dict[str, dict[str, list[RunSummary]]]:
    def cell(bandit: str, policy: str, finals: list[float], preset: str = "") -> list[RunSummary]:
        return [_run(bandit, policy, s, v, preset) for s, v in enumerate(finals)]

    return {
        "a": {
            "ROFU": cell("a", "ROFU", [30, 31, 32, 33, 34, 35], "product"),
            TUNED_POLICY: cell("a", TUNED_POLICY, [10, 11, 12, 13, 14, 15], "linear"),
            "Greedy": cell("a", "Greedy", [20, 22, 21, 23, 19, 20]),
        },
        "b": {
            "ROFU": cell("b", "ROFU", [5, 6, 5, 6, 5, 6], "product"),
            "Greedy": cell("b", "Greedy", [9, 9, 8, 9, 9, 9]),
        },
    }


def test_split_keeps_rofu_tuned_out_of_the_headline_and_puts_it_in_rofus_place():
    headline, tuned = split(_results())
    assert set(headline["a"]) == {"ROFU", "Greedy"}
    assert [r.policy for r in tuned["a"]["ROFU"]] == [TUNED_POLICY] * 6
    assert tuned["b"]["ROFU"] is headline["b"]["ROFU"]  # no tuned runs: ROFU's own
    one, per_set = summarise(headline), summarise(tuned)
    assert one["a"]["Greedy"].rank == 1  # Greedy beats ROFU on one preset on a ...
    assert per_set["a"]["ROFU"].rank == 1  # ... and loses to ROFU on a's tuned preset
    assert per_set["a"]["ROFU"].mean == pytest.approx(12.5)
    assert per_set["a"]["Greedy"].normalised == pytest.approx(20.833 / 12.5, rel=1e-3)
    assert split({"a": {"ROFU": _results()["a"]["ROFU"]}})[1] == {}


def test_section_sets_the_two_rofu_cells_side_by_side_with_their_presets():
    results = _results()
    headline, tuned = split(results)
    text = section(summarise(headline), summarise(tuned), results)
    # 6 of 6 seeds lower: the exact two-sided Wilcoxon p is 2 / 2^6
    assert "| a | `product` | 32.5 +- 0.8 | `linear` | 12.5 +- 0.8 | 0.385 | 0.031 |" in text
    assert "| b | `product` | 5.5 +- 0.2 | ROFU's runs | 5.5 +- 0.2 | 1 | - |" in text
    assert "| ROFU | 12.5 +- 0.8 (`linear`) | 5.5 +- 0.2 (`product`) |" in text
    assert "| ROFU | 6 x T=2 (seeds 0-5) | 6 x T=2 (seeds 0-5) |" in text


def test_replay_runs_rofu_tuned_beside_rofu_and_reports_both_tables(tmp_path, monkeypatch):
    monkeypatch.setitem(policies.TUNED_PRESETS, "wheel", "linear")
    out = tmp_path / "run"
    argv = ["--datasets", "wheel", "--seeds", "0-1", "--rounds", "30", "--no-progress"]
    names = "ROFU,ROFU-tuned,LinUCB"
    assert main([*argv, "--policies", names, "--out", str(out)]) == 0
    tuned = RunSummary.load(out / "runs" / "wheel" / TUNED_POLICY / "seed1-T30-linear.json")
    assert (tuned.preset, tuned.config["net"]["activation"]) == ("linear", "identity")
    report = (out / "README.md").read_text()
    headline = report.split("## ROFU on one preset and on each data set's tuned preset")[0]
    assert "| ROFU-tuned |" not in headline.split("## Regret curves")[0]
    assert "(`linear`)" in report
    document = json.loads((out / "results.json").read_text())
    assert set(document["cells"]["wheel"]) == {"ROFU", "LinUCB"}
    assert document["per_data_set_presets"]["cells"]["wheel"]["ROFU"]["preset"] == "linear"
    # with ROFU on the tuned preset itself, ROFU-tuned has nothing to add
    again = tmp_path / "again"
    assert main([*argv, "--policies", names, "--preset", "linear", "--out", str(again)]) == 0
    assert not (again / "runs" / "wheel" / TUNED_POLICY).exists()
