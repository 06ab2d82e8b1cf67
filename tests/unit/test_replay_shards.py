"""A study as a plan and as shards: `--plan` lists its runs without running any, and the
study run as 4 shards (separately, in any order, into one folder) gives the same run files
and the same report tables as the study run with `--workers 2`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from rofu.replay.cli import main
from rofu.replay.plan import Shard, expected_cost, slices
from rofu.replay.runner import Job

TIMINGS = {"seconds", "cpu_seconds"}


def _toy_csv(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 2))
    lines = ["x,y,kind"] + [f"{a:.4f},{b:.4f},{'l' if a < 0 else 'r'}" for a, b in x]
    path = folder / "toy.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _study(tmp_path: Path, out: Path) -> list[str]:
    return [
        "--dataset-file", str(_toy_csv(tmp_path)), "--policies", "Uniform,LinUCB,Greedy",
        "--seeds", "0-1", "--rounds", "120", "--out", str(out), "--no-progress",
    ]  # fmt: skip


def _runs(out: Path) -> dict[str, dict]:
    files = sorted((out / "runs").rglob("*.json"))
    return {
        str(path.relative_to(out)): {
            k: v for k, v in json.loads(path.read_text()).items() if k not in TIMINGS
        }
        for path in files
    }


def _tables(out: Path) -> dict[str, dict]:
    """The report's cells without their timings."""
    cells = json.loads((out / "results.json").read_text())["cells"]
    return {
        bandit: {
            policy: {k: v for k, v in cell.items() if "seconds" not in k and k != "cpu_per_seed"}
            for policy, cell in by_policy.items()
        }
        for bandit, by_policy in cells.items()
    }


def test_four_shards_in_any_order_make_the_same_study_as_two_workers(tmp_path, capsys):
    sharded, pooled = tmp_path / "sharded", tmp_path / "pooled"
    argv = _study(tmp_path, sharded)
    assert main([*argv, "--plan", "--shard", "0/4"]) == 0
    listed = capsys.readouterr().out
    assert "6 runs: 0 done, 6 pending" in listed
    assert listed.count("shard 0/4") + listed.count("shard 1/4") >= 2
    for index in (2, 0, 3):
        assert main([*argv, "--shard", f"{index}/4"]) == 0
        assert "still pending" in capsys.readouterr().out
        assert not (sharded / "README.md").exists()  # no report before the last shard
    assert main([*argv, "--shard", "1/4"]) == 0  # the last: the study is complete
    assert main([*_study(tmp_path, pooled), "--workers", "2"]) == 0
    assert _runs(sharded) == _runs(pooled)
    assert len(_runs(sharded)) == 6
    cells = [_tables(out) for out in (sharded, pooled)]
    assert cells[0] == cells[1]
    readme = (sharded / "README.md").read_text()
    assert "--shard" not in readme  # the report names the whole study's command
    assert main([*argv, "--plan"]) == 0
    assert "6 runs: 6 done, 0 pending" in capsys.readouterr().out


def test_slices_are_disjoint_balanced_and_fixed_by_the_plan():
    jobs = [Job("d", policy, seed, 1000) for seed in range(5) for policy in ("ROFU", "Uniform")]
    parts = slices(jobs, 3)
    flat = [j for part in parts for j in part]
    assert len(flat) == len(set(flat)) == len(jobs)  # each job exactly once
    assert set(flat) == set(jobs)
    loads = [sum(expected_cost(j) for j in part) for part in parts]
    assert max(loads) - min(loads) <= max(expected_cost(j) for j in jobs)
    assert expected_cost(Job("d", "ROFU", 0, 1000)) == 3 * expected_cost(
        Job("d", "Uniform", 0, 1000)
    )
    assert slices(jobs, 3) == parts  # deterministic
    assert slices(jobs, 1) == [jobs]


@pytest.mark.parametrize("text", ["4/4", "-1/4", "1", "a/b", "0/0", "1/2/3"])
def test_a_shard_outside_the_plan_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--shard"):
        Shard.parse(text)


def test_shard_and_plan_refuse_report_only_before_anything_runs(tmp_path, capsys):
    argv = _study(tmp_path, tmp_path / "out")
    with pytest.raises(SystemExit):
        main([*argv, "--shard", "0/2", "--report-only"])
    assert "--shard and --report-only do not go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--shard", "2/2"])
    assert "the index must be in 0..N-1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--shard", "0/2", "--merge", str(tmp_path)])
    assert "--shard and --merge do not go together" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_shards_in_separate_folders_merge_into_the_same_study(tmp_path, capsys):
    folders = [tmp_path / f"shard{i}" for i in range(2)]
    for index, folder in enumerate(folders):
        assert main([*_study(tmp_path, folder), "--shard", f"{index}/2"]) == 0
    merged, pooled = tmp_path / "merged", tmp_path / "pooled"
    argv = _study(tmp_path, merged)
    assert main([*argv, "--merge", ",".join(map(str, folders))]) == 0
    assert "6 run files gathered" in capsys.readouterr().out
    assert main([*_study(tmp_path, pooled)]) == 0
    assert _runs(merged) == _runs(pooled)
    assert _tables(merged) == _tables(pooled)
    assert "--merge" not in (merged / "README.md").read_text()  # the study's own command
    assert main([*argv, "--merge", ",".join(map(str, folders))]) == 0  # again: nothing new
    assert "0 run files gathered" in capsys.readouterr().out
    one = next((folders[0] / "runs").rglob("*.json"))
    one.write_text(one.read_text().replace('"seed": ', '"seed":  '))  # another run's bytes
    with pytest.raises(SystemExit):
        main([*argv, "--merge", ",".join(map(str, folders))])
    assert "two different runs under one name" in capsys.readouterr().err
