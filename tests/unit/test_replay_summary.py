"""Run summaries: what a study commits of each run, what its report reads, and what a resumed
study trusts."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import rofu.replay.runner as runner
from rofu.replay.cli import main
from rofu.replay.compact import compact
from rofu.replay.reports.bonus import markdown_table, step_table
from rofu.replay.reports.table import summarise
from rofu.replay.runner import Job, jobs_for, run_jobs
from rofu.replay.runs import collect
from rofu.replay.simulation.bandits import PoolBandit
from rofu.replay.simulation.policies import build_policy, configuration
from rofu.replay.simulation.simulate import RunResult, simulate
from rofu.replay.simulation.summary import CURVE_POINTS, RunSummary, curve_rounds

CPU = torch.device("cpu")


def _toy() -> PoolBandit:
    contexts = np.eye(3)[np.arange(6) % 3] + 0.1
    return PoolBandit("toy", contexts, np.eye(3)[np.arange(6) % 3])


def _run(policy: str, seed: int, rounds: int = 60) -> RunResult:
    built = build_policy(policy, 3, 3, seed, CPU)
    stream = _toy().stream(rounds, seed)
    config = configuration(built)
    return simulate(built, stream, bandit="toy", policy_name=policy, seed=seed, config=config)


def _job(run: RunResult) -> dict[str, object]:
    return dataclasses.asdict(Job(run.bandit, run.policy, run.seed, run.rounds))


def test_summary_round_trip_is_exact_and_small(tmp_path: Path) -> None:
    run = _run("ROFU@cap=0.001", 0)
    assert run.config is not None
    assert isinstance(run.config["net"]["hidden"], tuple)
    summary = RunSummary.of(run, _job(run))
    path = tmp_path / "runs" / "toy" / "ROFU" / "seed0-T60.json"
    summary.save(path)
    assert RunSummary.load(path) == summary
    assert not list(path.parent.glob("*.partial*"))
    assert (summary.final_pseudo_regret, summary.final_regret) == (
        run.final_pseudo_regret,
        run.final_regret,
    )
    assert summary.config is not None
    assert summary.config["net"]["hidden"] == list(run.config["net"]["hidden"])  # as JSON reads
    assert summary.ascent is not None
    assert summary.ascent.capped > 0
    assert path.stat().st_size < 4096
    assert json.loads(path.read_text())["format"] == 1  # readable: one field a line
    assert len(path.read_text().splitlines()) == 2 + 1 + len(dataclasses.fields(RunSummary))


def test_curves_are_capped_at_curve_points() -> None:
    run = _run("Uniform", 1, rounds=1000)
    summary = RunSummary.of(run, _job(run))
    assert len(summary.regret_curve) == CURVE_POINTS == 200
    assert summary.bonus is not None
    assert len(summary.bonus.curve) <= CURVE_POINTS
    kept = curve_rounds(1000)
    assert (kept[0], kept[-1], len(set(kept))) == (5, 1000, 200)
    want = np.cumsum(run.pseudo_regret)[kept - 1]
    np.testing.assert_allclose(summary.regret_curve, want, rtol=1e-3)
    assert summary.regret_curve[-1] == pytest.approx(run.final_pseudo_regret, rel=1e-3)
    short = _run("Uniform", 1, rounds=50)
    assert len(RunSummary.of(short, _job(short)).regret_curve) == 50  # one point a round


def _full_early_late(runs: list[RunResult]) -> tuple[float, float]:
    """The bonus table's early and late means from the per-round arrays: the mean over
    seeds round by round, then over the first and last tenth of the rounds that have one."""
    stacked = np.stack([np.where(np.isfinite(r.bonus), r.bonus, np.nan) for r in runs])  # type: ignore[arg-type]
    counts = np.isfinite(stacked).sum(axis=0)
    curve = np.where(counts > 0, np.nansum(stacked, axis=0) / np.maximum(counts, 1), np.nan)
    rounds = curve[np.isfinite(curve)]
    tail = max(1, int(0.1 * rounds.size))
    return float(rounds[:tail].mean()), float(rounds[-tail:].mean())


def test_report_from_summaries_equals_the_one_from_full_runs() -> None:
    full = {
        policy: [_run(policy, seed) for seed in range(3)]
        for policy in ("ROFU@cap=0.001", "Uniform", "Greedy")
    }
    summaries = {p: [RunSummary.of(r, _job(r)) for r in runs] for p, runs in full.items()}
    cells = summarise({"toy": summaries})["toy"]
    for policy, runs in full.items():
        assert cells[policy].finals == [r.final_pseudo_regret for r in runs]
        assert cells[policy].realised_mean == pytest.approx(np.mean([r.final_regret for r in runs]))
    early, late = _full_early_late(full["ROFU@cap=0.001"])
    largest = max(float(np.nanmax(r.bonus)) for r in full["ROFU@cap=0.001"])  # type: ignore[arg-type]
    row = (
        f"| toy | ROFU@cap=0.001 | {early:.4f} | {late:.4f} | {late / early:.2f} | {largest:.3g} |"
    )
    assert row in markdown_table({"toy": summaries})
    assert "| toy | Greedy |" not in markdown_table({"toy": summaries})  # its bonus is 0
    cuts = np.concatenate(
        [r.ascent_step[np.isfinite(r.ascent_step)] for r in full["ROFU@cap=0.001"]]  # type: ignore[index]
    )
    scale = cuts / build_policy("ROFU@cap=0.001", 3, 3, 0, CPU).rofu.step_size
    capped = scale[scale < 1 - 1e-9]
    table = step_table({"toy": summaries})
    assert f"| {capped.size / scale.size:.1%} | {np.median(capped):.3g} | {capped.min():.3g} |" in (
        table
    )


def test_resumed_study_skips_every_run_whose_summary_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _toy())
    jobs = jobs_for(["toy"], ["Uniform", "LinUCB"], [0, 1], rounds=20)
    run_jobs(jobs, tmp_path, progress=False)
    assert all(job.cache_path(tmp_path).is_file() for job in jobs)
    for job in jobs:  # the cache is not committed: a clean clone has summaries only
        job.cache_path(tmp_path).unlink()

    def never(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a run whose summary exists ran again")

    monkeypatch.setattr(runner, "run_job", never)
    assert run_jobs(jobs, tmp_path, progress=False) == [job.path(tmp_path) for job in jobs]
    assert set(collect(tmp_path)["toy"]) == {"Uniform", "LinUCB"}


def test_corrupt_or_other_jobs_summary_is_a_clear_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _toy())
    one, other = jobs_for(["toy"], ["Uniform", "LinUCB"], [0], rounds=20)
    run_jobs([other], tmp_path, progress=False)
    path = one.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "bandit": "toy"')  # cut short
    with pytest.raises(ValueError, match=r"is not a replay run summary .*delete it"):
        run_jobs([one], tmp_path, progress=False)
    with pytest.raises(ValueError, match="is not a replay run summary"):
        collect(tmp_path)
    path.write_text(other.path(tmp_path).read_text())  # another job's summary in its place
    with pytest.raises(ValueError, match=r"holds the run of .*'LinUCB'.*not of .*'Uniform'"):
        run_jobs([one], tmp_path, progress=False)
    record = json.loads(other.path(tmp_path).read_text()) | {"format": 0}
    other.path(tmp_path).write_text(json.dumps(record))
    argv = ["--policies", "LinUCB", "--seeds", "0", "--rounds", "20", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--report-only"])
    assert exc.value.code == 2
    assert "not format 1" in capsys.readouterr().err
    wheel = Job("wheel", "LinUCB", 0, 20).path(tmp_path)
    wheel.parent.mkdir(parents=True)
    wheel.write_text("{}")
    with pytest.raises(SystemExit) as exc:  # the command names the file and runs nothing
        main([*argv, "--datasets", "wheel"])
    assert exc.value.code == 2
    assert f"{wheel} is not a replay run summary" in capsys.readouterr().err


def test_compact_converts_full_run_files_once(tmp_path, capsys) -> None:
    runs = [_run("ROFU@cap=0.001", 0), _run("Greedy", 1)]
    paths = [
        tmp_path / "runs/toy/ROFU@cap=0.001/seed0-T60.npz",
        tmp_path / "runs/toy/Greedy/seed1-T60-small-lr.npz",
    ]
    for run, path in zip(runs, paths, strict=True):
        run.save(path)
    with pytest.raises(ValueError, match="--compact"):
        collect(tmp_path)
    assert main(["--compact", "--out", str(tmp_path)]) == 0
    assert "2 run files" in capsys.readouterr().out
    small_lr = Job("toy", "Greedy", 1, 60, preset="small-lr")
    assert RunSummary.load(small_lr.path(tmp_path)) == RunSummary.of(
        runs[1], _job(runs[1]) | {"preset": "small-lr"}
    )
    assert not list((tmp_path / "runs").glob("*/*/*.npz"))
    cached = RunResult.load(small_lr.cache_path(tmp_path))
    np.testing.assert_array_equal(cached.pseudo_regret, runs[1].pseudo_regret)
    assert compact(tmp_path) == []  # nothing left to convert
    assert not math.isnan(collect(tmp_path)["toy"]["Greedy"][0].final_pseudo_regret)
    RunResult.load(small_lr.cache_path(tmp_path)).save(
        tmp_path / "runs/toy/Greedy/seed1-T60-nope.npz"
    )
    with pytest.raises(ValueError, match="names no preset or learner"):
        compact(tmp_path)
