"""The replay harness's core: paired simulation, result files, the runner and the report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rofu.models.presets import PRESETS, PRODUCT
from rofu.replay.arguments import build_parser, parse_seeds
from rofu.replay.cli import main
from rofu.replay.reports.combine import combine
from rofu.replay.reports.paired import holm
from rofu.replay.reports.report import json_safe, write_report
from rofu.replay.reports.table import markdown, same_seed_ratios, seed_ranges, summarise
from rofu.replay.runner import Job, jobs_for, run_jobs
from rofu.replay.runs import collect, seed_and_rounds
from rofu.replay.simulation.bandits import PoolBandit
from rofu.replay.simulation.policies import (
    POLICIES,
    PRESET_POLICIES,
    TUNED_PRESETS,
    build_policy,
    configuration,
    resolve_preset,
    rofu_variant,
)
from rofu.replay.simulation.simulate import WARM_START, RunResult, simulate
from rofu.replay.simulation.summary import RunSummary

ARMS = 3
ROOT = Path(__file__).resolve().parents[2]


def _bandit() -> PoolBandit:
    """Three arms; arm i pays 1 on rows of class i (rows 0..5 cycle through classes)."""
    contexts = np.eye(ARMS)[np.arange(6) % ARMS] + 0.1
    return PoolBandit("toy", contexts, np.eye(ARMS)[np.arange(6) % ARMS])


def test_simulate_warm_start_and_regret_bookkeeping():
    stream = _bandit().stream(40, seed=1)
    policy = build_policy("Uniform", ARMS, ARMS, 0, torch.device("cpu"))
    result = simulate(policy, stream, bandit="toy", policy_name="Uniform", seed=1)
    assert list(result.arms[: WARM_START * ARMS]) == [t % ARMS for t in range(WARM_START * ARMS)]
    rows = np.arange(40)
    want = stream.rewards.max(1) - stream.rewards[rows, result.arms]
    np.testing.assert_array_equal(result.regret, want)
    np.testing.assert_array_equal(
        result.pseudo_regret, stream.means.max(1) - stream.means[rows, result.arms]
    )
    assert result.final_regret == pytest.approx(want.sum())
    assert (result.rounds, result.policy, result.seed) == (40, "Uniform", 1)


class _Recorder:
    """A policy that always picks the last arm and records what it learns from."""

    name, n_arms = "Recorder", ARMS

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def select(self, contexts, candidates=None):
        from rofu.models import Decision, Scores

        zeros = torch.zeros(len(contexts), ARMS)
        return Decision(
            torch.full((len(contexts),), ARMS - 1), torch.ones(len(contexts)), Scores(zeros, zeros)
        )

    def update(self, batch):
        self.seen.extend(zip(batch.arms.tolist(), batch.rewards.tolist(), strict=True))
        return {}


def test_simulate_feeds_every_round_to_the_policy():
    stream = _bandit().stream(25, seed=2)
    policy = _Recorder()
    result = simulate(policy, stream)
    assert [arm for arm, _ in policy.seen] == list(result.arms)
    assert all(arm == ARMS - 1 for arm in result.arms[WARM_START * ARMS :])
    want = stream.rewards[np.arange(25), result.arms]
    np.testing.assert_allclose([r for _, r in policy.seen], want, rtol=1e-6)


def test_runresult_save_load_round_trip(tmp_path):
    result = RunResult(
        "toy",
        "P",
        3,
        np.array([0, 2, 1]),
        np.array([0.0, 1.0, 0.5]),
        np.array([0.0, 0.5, 0.25]),
        1.25,
        cpu_seconds=2.5,
    )
    path = tmp_path / "x" / "r.npz"
    result.save(path)
    loaded = RunResult.load(path)
    assert (loaded.bandit, loaded.policy, loaded.seed, loaded.seconds) == ("toy", "P", 3, 1.25)
    assert loaded.cpu_seconds == 2.5
    np.testing.assert_array_equal(loaded.arms, result.arms)
    np.testing.assert_array_equal(loaded.pseudo_regret, result.pseudo_regret)
    assert not list(path.parent.glob("*.partial*"))


def test_runner_is_resumable_and_parallel(tmp_path, monkeypatch):
    import rofu.replay.runner as runner

    monkeypatch.setattr(runner, "_bandit", lambda name, data_dir: _bandit())
    jobs = jobs_for(["toy"], ["Uniform", "LinUCB"], [0, 1], rounds=30)
    assert len(jobs) == 4
    order = jobs_for(["toy", "wheel"], ["Uniform", "LinUCB"], [0, 1], rounds=30)
    assert [(j.seed, j.bandit, j.policy) for j in order[:4]] == [  # seed by seed
        (0, "toy", "Uniform"),
        (0, "toy", "LinUCB"),
        (0, "wheel", "Uniform"),
        (0, "wheel", "LinUCB"),
    ]
    paths = run_jobs(jobs, tmp_path, workers=1, device="cpu", progress=False)
    assert all(p.exists() for p in paths)
    stamps = [p.stat().st_mtime_ns for p in paths]
    run_jobs(jobs, tmp_path, workers=1, device="cpu", progress=False)  # nothing left to do
    assert [p.stat().st_mtime_ns for p in paths] == stamps
    assert Job("toy", "LinUCB", 1, 30).path(tmp_path) in paths


def test_run_file_names_give_back_their_seed_and_rounds(tmp_path):
    tagged = Job("toy", "ROFU", 12, 20_000, preset="small-lr", learner="wide")
    for job in (Job("toy", "LinUCB", 3, 50), tagged):
        assert seed_and_rounds(job.path(tmp_path)) == (job.seed, job.rounds)
    assert tagged.path(tmp_path).name == "seed12-T20000-small-lr-wide.json"
    assert (
        tagged.cache_path(tmp_path) == tmp_path / "cache/toy/ROFU/seed12-T20000-small-lr-wide.npz"
    )
    assert seed_and_rounds(Path("seed3.json")) is None
    being_written = tagged.path(tmp_path).name + ".partial.json"  # RunSummary.save's name
    assert seed_and_rounds(Path(being_written)) is None
    with pytest.raises(ValueError, match="dot"):
        Job("toy", "ROFU", 0, 50, preset="lr.1").path(tmp_path)


def test_runner_failed_job_starts_no_queued_job(tmp_path):
    bad = [Job("nope", "Uniform", seed, 50) for seed in (0, 1)]  # fail as they start
    good = jobs_for(["wheel"], ["Uniform"], range(12), rounds=50)
    with pytest.raises(ValueError, match="unknown data set 'nope'"):
        run_jobs([*bad, *good], tmp_path, workers=2, device="cpu", progress=False)
    ran = sum(job.path(tmp_path).exists() for job in good)
    assert ran < len(good)  # only those already handed to a worker


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_runner_workers_die_with_a_killed_parent(tmp_path):
    script = (
        "from pathlib import Path; from rofu.replay.runner import jobs_for, run_jobs; "
        "run_jobs(jobs_for(['wheel'], ['Greedy'], [0, 1], rounds=10**6), "
        f"Path({str(tmp_path)!r}), workers=2, progress=False)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    busy: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while len(busy) < 2 and time.monotonic() < deadline:
            assert parent.poll() is None, "run_jobs exited before its workers started"
            pids = map(int, children.read_text().split())
            # importing torch and replay costs a worker about 1.4 s of CPU: past 5 s it runs
            # its job, so its initializer has run
            busy = {pid for pid in pids if _cpu_seconds(pid) > 5}
            time.sleep(0.2)
        assert len(busy) == 2, "the workers never started their jobs"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60
        while (alive := {pid for pid in busy if _running(pid)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, f"workers {sorted(alive)} outlived their killed parent"
    finally:  # leave nothing running when the test fails
        parent.kill()
        for pid in filter(_running, busy):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (state first); [] once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return []


def _cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has finished)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _fake_runs(finals: dict[str, list[float]]) -> dict[str, dict[str, list[RunSummary]]]:
    runs: dict[str, list[RunSummary]] = {}
    for policy, values in finals.items():
        runs[policy] = [
            _summary(
                "b",
                policy,
                seed,
                np.zeros(2, dtype=np.int64),
                np.array([v, 0.0]),
                np.array([v, 0.0]),
                2.0,
            )
            for seed, v in enumerate(values)
        ]
    return {"b": runs}


def _summary(*fields: object) -> RunSummary:
    return RunSummary.of(RunResult(*fields), {})


def test_report_statistics():
    finals = {
        "ROFU": [10, 11, 12, 13, 14, 15],
        "Uniform": [100, 90, 110, 95, 105, 100],
        "Greedy": [20, 22, 21, 23, 19, 20],
    }
    table = summarise(_fake_runs(finals))["b"]
    assert table["ROFU"].mean == pytest.approx(12.5)
    assert table["ROFU"].sem == pytest.approx(np.std(finals["ROFU"], ddof=1) / math.sqrt(6))
    assert table["ROFU"].normalised == pytest.approx(1.0)
    assert table["Greedy"].normalised == pytest.approx(np.mean(finals["Greedy"]) / 12.5)
    assert table["Uniform"].relative_uniform == pytest.approx(100.0)
    assert table["ROFU"].relative_uniform == pytest.approx(100 * 12.5 / 100.0)
    assert [table[p].rank for p in ("ROFU", "Greedy", "Uniform")] == [1.0, 2.0, 3.0]
    assert table["Greedy"].wilcoxon_p == pytest.approx(0.03125)  # all 6 paired diffs positive
    assert math.isnan(table["ROFU"].wilcoxon_p)
    assert table["ROFU"].seconds_per_round == pytest.approx(1.0)


def test_holm_adjusts_step_down_and_keeps_the_untested_nan():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "ref": math.nan, "d": 0.5})
    assert adjusted["a"] == pytest.approx(0.04)  # 4 x 0.01
    assert adjusted["c"] == pytest.approx(0.09)  # 3 x 0.03
    assert adjusted["b"] == pytest.approx(0.09)  # max(2 x 0.04, the one before)
    assert adjusted["d"] == pytest.approx(0.5)  # min(1, 1 x 0.5), monotone
    assert math.isnan(adjusted["ref"])
    assert holm({"a": 0.6, "b": 0.7})["a"] == 1.0  # capped at 1


def test_report_holm_adjusts_the_tests_and_tables_cpu_time(tmp_path):
    finals = {
        "ROFU": [10, 11, 12, 13, 14, 15],
        "Uniform": [100, 90, 110, 95, 105, 100],
        "Greedy": [20, 22, 21, 23, 19, 20],
    }
    runs = _fake_runs(finals)
    table = summarise(runs)["b"]
    assert table["Greedy"].wilcoxon_holm == pytest.approx(2 * table["Greedy"].wilcoxon_p)
    assert math.isnan(table["ROFU"].wilcoxon_holm)
    assert math.isnan(table["ROFU"].cpu_seconds_per_round)  # the fakes record no CPU time
    assert "CPU seconds per" not in markdown({"b": table}, "t")

    def timed(rofu_cpu: float) -> dict[str, list[RunSummary]]:
        return {
            policy: [
                dataclasses.replace(r, cpu_seconds=rofu_cpu if policy == "ROFU" else 1.0)
                for r in policy_runs
            ]
            for policy, policy_runs in runs["b"].items()
        }

    tables = summarise({"b": timed(3.0), "c": timed(5.0)})
    assert tables["b"]["ROFU"].cpu_seconds_per_round == pytest.approx(1.5)  # 3 s over 2 rounds
    text = markdown(tables, "t")
    assert "Holm-adjusted" in text
    # CPU seconds per 20 000 rounds on each data set, their mean, that over Greedy's, and
    # the median of each run's over Greedy's run of the same seed
    assert "| policy | b | c | mean | mean / Greedy's | median of run / Greedy's" in text
    assert "| ROFU | 30000 | 50000 | 40000 | 4.00 | 4.00 |" in text
    assert "| Greedy | 10000 | 10000 | 10000 | 1.00 | 1.00 |" in text


def test_running_time_pairs_each_run_with_greedys_run_of_the_same_seed():
    runs = _fake_runs({"ROFU": [1, 2, 3, 4], "Greedy": [5, 6, 7, 8]})["b"]
    # a host that slowed down for seed 3 slows both policies' runs of that seed
    rofu_cpu, greedy_cpu = [2.0, 2.0, 3.0, 200.0], [1.0, 1.0, 1.0, 100.0]
    timed = {
        "ROFU": [
            dataclasses.replace(r, cpu_seconds=c)
            for r, c in zip(runs["ROFU"], rofu_cpu, strict=True)
        ],
        # Greedy has no run of seed 2: that seed has no pair
        "Greedy": [
            dataclasses.replace(r, cpu_seconds=c)
            for r, c in zip(runs["Greedy"], greedy_cpu, strict=True)
            if r.seed != 2
        ],
    }
    cells = summarise({"b": timed})["b"]
    assert cells["ROFU"].cpu_per_seed == [1.0, 1.0, 1.5, 100.0]  # per round: 2 rounds a run
    assert same_seed_ratios(cells, "ROFU", "Greedy") == [2.0, 2.0, 2.0]  # seeds 0, 1, 3
    assert same_seed_ratios(cells, "ROFU", "Uniform") == []
    text = markdown({"b": cells}, "t")
    # the ratio of the means (517 500 / 340 000) mixes in seed 2, which Greedy did not run;
    # the median of the same-seed pairs does not
    assert "| ROFU | 517500 | 517500 | 1.52 | 2.00 |" in text
    untimed = summarise(_fake_runs({"ROFU": [1, 2], "Greedy": [3, 4]}))["b"]
    assert untimed["ROFU"].cpu_per_seed == []
    assert same_seed_ratios(untimed, "ROFU", "Greedy") == []


def test_report_tests_the_estimators_against_rofu_exact_without_rofu():
    finals = {"ROFU-exact": [10, 11, 12, 13, 14], "ROFU-NTK": [11, 13, 14, 15, 17]}
    table = summarise(_fake_runs(finals))["b"]
    assert table["ROFU-NTK"].wilcoxon_p == pytest.approx(0.0625)  # 5 pairs, all one way
    assert math.isnan(table["ROFU-exact"].wilcoxon_p)
    assert "against ROFU-exact" in markdown({"b": table}, "t")


def test_report_writes_markdown_json_and_plots(tmp_path):
    for policy, runs in _fake_runs({"ROFU": [1, 2], "Uniform": [5, 6]})["b"].items():
        for run in runs:
            run.save(tmp_path / "runs" / "b" / policy / f"seed{run.seed}-T2.json")
    (tmp_path / "NOTES.md").write_text("What it says: ROFU wins.\n")
    readme = write_report(tmp_path, "Test report", "preamble text", rounds=2)
    text = readme.read_text()
    assert text.index("preamble text") < text.index("What it says: ROFU wins.") < text.index("##")
    assert "| ROFU | 1.00 |" in text
    assert "| ROFU | 2 x T=2 (seeds 0-1) |" in text  # every cell names its seeds and rounds
    assert (tmp_path / "plots" / "regret-b.png").stat().st_size > 1000
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["cells"]["b"]["ROFU"]["wilcoxon_p"] is None
    assert document["mean_rank"] == {"ROFU": 1.0, "Uniform": 2.0}
    assert document["mean_normalised"] == {"ROFU": 1.0, "Uniform": pytest.approx(11 / 3)}
    assert "| Uniform | 2.00 | 3.67 |" in text
    assert collect(tmp_path, rounds=99) == {}
    assert "n/a" in markdown(summarise(_fake_runs({"ROFU": [1.0]})), "t")


def _written_report(
    folder,
    finals: dict[str, list[float]],
    rounds: int = 2,
    first_seed: int = 0,
    cpu_seconds: float | None = None,
) -> None:
    for policy, values in finals.items():
        for seed, value in enumerate(values, start=first_seed):
            per_round = np.zeros(rounds)
            per_round[0] = value
            run = RunResult(
                "b",
                policy,
                seed,
                np.zeros(rounds, np.int64),
                per_round,
                per_round,
                1.0,
                cpu_seconds=None if cpu_seconds is None else cpu_seconds * (seed + 1),
            )
            RunSummary.of(run, {}).save(
                folder / "runs" / "b" / policy / f"seed{seed}-T{rounds}.json"
            )
    write_report(folder, "part")


def test_combined_report_takes_later_cells_and_recomputes_the_comparisons(tmp_path):
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "combined"
    _written_report(old, {"ROFU": [8, 9, 10], "Greedy": [4, 5, 6], "Uniform": [20, 20, 20]})
    _written_report(new, {"ROFU": [1, 2, 3]})
    kept = json.loads((old / "results.json").read_text())["cells"]["b"]["Greedy"]
    assert kept["finals"] == [4.0, 5.0, 6.0]  # per seed, so a later combine can test pairs
    (out / "NOTES.md").parent.mkdir()
    (out / "NOTES.md").write_text("Hand-written remarks.\n")
    text = combine([old, new], out, "Combined", "made from two").read_text()
    cells = json.loads((out / "results.json").read_text())["cells"]["b"]
    assert cells["ROFU"]["mean"] == 2.0
    assert cells["ROFU"]["source"] == str(new)
    assert cells["Greedy"]["source"] == str(old)
    assert (cells["ROFU"]["rank"], cells["Greedy"]["rank"], cells["Uniform"]["rank"]) == (1, 2, 3)
    assert cells["Greedy"]["normalised"] == pytest.approx(2.5)
    assert cells["Uniform"]["relative_uniform"] == pytest.approx(100.0)
    assert cells["Greedy"]["wilcoxon_p"] == pytest.approx(0.25)  # 3 pairs, all one way
    assert "Hand-written remarks." in text
    assert "made from two" in text
    assert f"| ROFU | `{new}` |" in text
    only = combine([old, new], tmp_path / "only", "t", policies=("ROFU", "Uniform"))
    assert "Greedy" not in only.read_text()


def test_combined_report_merges_disjoint_seeds_and_replaces_overlapping_ones(tmp_path):
    first, more, redo = tmp_path / "first", tmp_path / "more", tmp_path / "redo"
    _written_report(first, {"ROFU": [1, 2], "Greedy": [10, 12]}, cpu_seconds=2.0)
    _written_report(
        more, {"ROFU": [3, 6, 9], "Greedy": [14, 16, 18]}, first_seed=2, cpu_seconds=2.0
    )
    _written_report(redo, {"Greedy": [7, 8, 9]})  # seeds 0-2 again: replaces, merges nothing
    text = combine([first, more], tmp_path / "out", "t").read_text()
    cells = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]["b"]
    rofu = cells["ROFU"]
    assert (rofu["seeds"], rofu["finals"]) == ([0, 1, 2, 3, 4], [1, 2, 3, 6, 9])
    assert rofu["mean"] == rofu["realised_mean"] == pytest.approx(4.2)  # weighted 2:3
    assert rofu["sem"] == pytest.approx(np.std([1, 2, 3, 6, 9], ddof=1) / math.sqrt(5))
    assert rofu["seconds_per_round"] == pytest.approx(0.5)
    assert rofu["cpu_per_seed"] == [1.0, 2.0, 3.0, 4.0, 5.0]  # 2 (seed + 1) s over 2 rounds
    assert rofu["source"] == f"{first} + {more}"
    assert cells["Greedy"]["wilcoxon_p"] == pytest.approx(0.0625)  # 5 pairs, all one way
    assert "| ROFU | 5 x T=2 (seeds 0-4) |" in text
    combine([first, more, redo], tmp_path / "out2", "t")
    greedy = json.loads((tmp_path / "out2" / "results.json").read_text())["cells"]["b"]["Greedy"]
    assert (greedy["seeds"], greedy["mean"], greedy["source"]) == ([0, 1, 2], 8.0, str(redo))
    assert greedy["cpu_per_seed"] == []  # `redo` recorded no CPU time


def test_seed_ranges_name_runs_of_consecutive_seeds():
    assert seed_ranges([1001, 0, 1, 2, 5, 1000]) == "0-2, 5, 1000-1001"
    assert seed_ranges([3]) == "3"


def test_combined_report_refuses_unlike_cells_and_missing_reports(tmp_path):
    _written_report(tmp_path / "short", {"ROFU": [1, 2]}, rounds=2)
    _written_report(tmp_path / "long", {"Greedy": [1, 2]}, rounds=3)
    with pytest.raises(ValueError, match="different T"):
        combine([tmp_path / "short", tmp_path / "long"], tmp_path / "out", "t")
    with pytest.raises(FileNotFoundError, match="no report"):
        combine([tmp_path / "nowhere"], tmp_path / "out", "t")
    with pytest.raises(ValueError, match="no cell"):
        combine([tmp_path / "short"], tmp_path / "out", "t", datasets=("statlog",))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text('{"cells": {"b": {"ROFU": {"mean": 1}}}}')
    with pytest.raises(ValueError, match="not a replay report"):
        combine([tmp_path / "bad"], tmp_path / "out", "t")
    assert not (tmp_path / "out").exists()


def test_replay_cli_combine_needs_an_out_folder_of_its_own(tmp_path, capsys):
    _written_report(tmp_path / "a", {"ROFU": [1, 2]})
    for argv in (
        ["--combine", str(tmp_path / "a")],
        ["--combine", str(tmp_path / "a"), "--out", str(tmp_path / "a")],
        ["--combine", str(tmp_path / "missing"), "--out", str(tmp_path / "c")],
        ["--combine", str(tmp_path / "a"), "--out", str(tmp_path / "c"), "--report-only"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert main(["--combine", str(tmp_path / "a"), "--out", str(tmp_path / "c")]) == 0
    assert "--combine" in (tmp_path / "c" / "README.md").read_text()
    with pytest.raises(SystemExit):
        main(["--report-only", "--out", str(tmp_path / "a")])  # runs are T=2, not 2000
    assert "no runs under" in capsys.readouterr().err
    assert main(["--report-only", "--out", str(tmp_path / "a"), "--rounds", "2"]) == 0
    regenerate = (tmp_path / "a" / "README.md").read_text()
    assert f"regenerate with `rofu replay --out {tmp_path / 'a'} --rounds 2`" in regenerate


def test_replay_report_holds_only_the_seeds_data_sets_and_policies_it_names(tmp_path, capsys):
    out = tmp_path / "study"
    for bandit in ("statlog", "mushroom"):
        for policy in ("ROFU", "Greedy"):
            for seed in range(4):
                per_round = np.full(2, float(seed))
                run = RunResult(
                    bandit, policy, seed, np.zeros(2, np.int64), per_round, per_round, 1.0
                )
                RunSummary.of(run, {}).save(out / "runs" / bandit / policy / f"seed{seed}-T2.json")

    def cells(*argv: str) -> dict:
        assert main(["--report-only", "--out", str(out), "--rounds", "2", *argv]) == 0
        return json.loads((out / "results.json").read_text())["cells"]

    everything = cells()
    assert {b: sorted(p) for b, p in everything.items()} == {
        "mushroom": ["Greedy", "ROFU"],
        "statlog": ["Greedy", "ROFU"],
    }
    assert everything["statlog"]["ROFU"]["seeds"] == [0, 1, 2, 3]
    some = cells("--seeds", "0-1")
    assert {cell["seeds"] == [0, 1] for by in some.values() for cell in by.values()} == {True}
    assert some["statlog"]["ROFU"]["mean"] == pytest.approx(1.0)  # 2 x seed over seeds 0, 1
    assert "--seeds 0-1" in (out / "README.md").read_text()
    one = cells("--datasets", "Statlog", "--policies", "rofu,greedy", "--seeds", "3")
    assert list(one) == ["statlog"]
    assert one["statlog"]["ROFU"]["seeds"] == [3]
    assert list(cells("--policies", "Greedy")["mushroom"]) == ["Greedy"]
    written = (out / "README.md").read_text()
    for argv, message in (
        (["--seeds", "7"], "no runs of seeds 7 under"),
        (["--datasets", "nope"], "unknown data set 'nope'"),
        (["--policies", "LinUCB"], "no runs of policies LinUCB under"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["--report-only", "--out", str(out), "--rounds", "2", *argv])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    assert (out / "README.md").read_text() == written  # a refused rebuild changes nothing
    with pytest.raises(SystemExit) as exc:
        main(["--report-only", "--out", str(out), "--http", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    assert "does not go with --http" in capsys.readouterr().err


def test_json_safe_turns_non_finite_into_null():
    assert json_safe({"a": [1.0, math.nan], "b": math.inf, "c": "x"}) == {
        "a": [1.0, None],
        "b": None,
        "c": "x",
    }


def test_build_policy_knows_every_name_and_refuses_others():
    for name in POLICIES:
        policy = build_policy(name, 4, 3, 0, torch.device("cpu"))
        assert policy.n_arms == 3
    with pytest.raises(ValueError, match="unknown policy 'Nope'"):
        build_policy("Nope", 4, 3, 0, torch.device("cpu"))


def test_rofu_variant_parses_overrides():
    variant = rofu_variant("ROFU@eta=0.1+reg=arm_count+hidden=32x16+fit_steps=3+base=drift")
    assert (variant.rofu.eta, variant.rofu.regulariser, variant.rofu.baseline) == (
        0.1,
        "arm_count",
        "drift",
    )
    assert (variant.hidden, variant.schedule.fit.steps) == ((32, 16), 3)
    fit = rofu_variant("ROFU@fit_opt=sgd+fit_batch=64+fit_sched=inverse_time+fit_decay=0.5")
    assert (fit.schedule.fit.optimizer, fit.schedule.fit.batch_size) == ("sgd", 64)
    assert (fit.schedule.fit.lr_schedule, fit.schedule.fit.lr_decay) == ("inverse_time", 0.5)
    with pytest.raises(ValueError, match="unknown ROFU variant key 'nope'"):
        rofu_variant("ROFU@nope=1")
    with pytest.raises(ValueError, match="optimizer"):
        rofu_variant("ROFU@fit_opt=lbfgs")
    showdown = rofu_variant("ROFU@fit_lr=0.01+learner=showdown")
    assert (showdown.hidden, showdown.init_scale, showdown.schedule.every) == ((50,), 0.3, 50)
    assert (showdown.schedule.fit.optimizer, showdown.schedule.fit.lr) == ("rmsprop", 0.01)
    assert showdown.rofu == PRODUCT.rofu
    neural = rofu_variant("ROFU@learner=neuralucb+wd=0.01")
    assert (neural.schedule.every, neural.schedule.fit.optimizer) == (20, "sgd")
    assert (neural.schedule.fit.lr, neural.schedule.fit.weight_decay) == (0.01, 0.01)
    assert neural.net(3, 2, 0) == PRODUCT.net(3, 2, 0)
    with pytest.raises(ValueError, match="learner must be one of"):
        rofu_variant("ROFU@learner=keras")
    with pytest.raises(ValueError, match="bad value 'wide'"):
        rofu_variant("ROFU@hidden=wide")
    assert rofu_variant("ROFU@persist=1").schedule.persist is True
    assert rofu_variant("ROFU@cap=1").rofu.stability_cap == 1.0
    capped = PRESETS["small-lr"]
    assert capped.rofu.stability_cap == 1.0
    assert rofu_variant("ROFU@cap=none", capped).rofu.stability_cap is None
    with pytest.raises(ValueError, match="stability_cap"):
        rofu_variant("ROFU@cap=0")
    assert rofu_variant("ROFU@persist=0").schedule.persist is False
    assert PRODUCT.schedule.persist is True
    with pytest.raises(ValueError, match="bad value 'yes' for ROFU variant key 'persist'"):
        rofu_variant("ROFU@persist=yes")
    linear = rofu_variant("ROFU@act=identity")
    assert linear.net(3, 2, 0).activation == "identity"
    assert PRODUCT.net(3, 2, 0).activation == "relu"
    with pytest.raises(ValueError, match="bad value 'swish' for ROFU variant key 'act'"):
        rofu_variant("ROFU@act=swish")


def test_greedy_matched_variant_takes_the_rofu_overrides():
    policy = build_policy("Greedy-matched@fit_lr=0.0001+hidden=8", 4, 3, 0, torch.device("cpu"))
    assert (policy.n_arms, policy.schedule.fit.lr, policy.net.config.hidden) == (3, 1e-4, (8,))


def test_rofu_takes_the_preset_it_is_given_and_only_that():
    cpu = torch.device("cpu")
    for name in ("ROFU", "Greedy-matched"):
        default = build_policy(name, 4, 2, 0, cpu)
        assert default.schedule == PRODUCT.schedule
        assert default.net.config.activation == "relu"
        small = build_policy(name, 4, 2, 0, cpu, preset=PRESETS["small-lr"])
        assert (small.schedule.fit.lr, small.schedule.persist) == (1e-4, True)
        assert small.schedule.fit.optimizer == "adam"
        sgd = build_policy(name, 4, 2, 0, cpu, preset=PRESETS["sgd-decay"]).schedule.fit
        assert (sgd.optimizer, sgd.lr, sgd.weight_decay) == ("sgd", 0.01, 1e-3)
        assert (sgd.steps, sgd.batch_size) == (10, 256)
        linear = build_policy(name, 4, 2, 0, cpu, preset=PRESETS["linear"])
        assert linear.net.config.activation == "identity"
        # the tuned presets keep one learner; the product's schedule runs the family
        assert linear.schedule == dataclasses.replace(default.schedule, family=False)
    assert build_policy("Greedy", 4, 2, 0, cpu, preset=PRESETS["small-lr"]).schedule.fit.lr == 0.1
    exact = build_policy("ROFU-exact", 4, 2, 0, cpu, preset=PRESETS["linear"])
    assert (exact.rofu.estimator, exact.net.config.activation) == ("exact", "identity")
    assert build_policy("ROFU-NTK", 4, 2, 0, cpu).rofu == PRODUCT.rofu
    assert set(TUNED_PRESETS.values()) <= set(PRESETS)
    for name in PRESET_POLICIES:
        assert resolve_preset(name) is not None
    assert resolve_preset("NeuralUCB") is None


def test_configuration_records_what_the_built_policy_runs():
    cpu = torch.device("cpu")
    preset = resolve_preset("ROFU-exact", PRESETS["linear"])
    assert preset is not None
    record = configuration(
        build_policy("ROFU-exact", 4, 2, 0, cpu, preset=PRESETS["linear"]), preset
    )
    assert record["class"] == "RofuPolicy"
    assert record["params"]["estimator"] == record["preset"]["rofu"]["estimator"] == "exact"
    assert record["net"]["activation"] == record["preset"]["activation"] == "identity"
    assert record["preset"]["name"] == "linear"
    assert record["schedule"]["fit"]["optimizer"] == "adam"
    ucb = configuration(build_policy("NeuralUCB", 4, 2, 0, cpu))
    assert (ucb["class"], ucb["full"]) == ("NeuralUCB", False)
    assert ucb["params"] == {"lam": 1e-3, "nu": 1.0, "z": "diag", "full_max_params": 2000}
    assert list(ucb["net"]["hidden"]) == [100]
    assert "preset" not in ucb
    json.dumps(record)  # JSON-ready as the run file stores it


def test_replay_cli_rejects_a_bad_policy_before_running_anything(tmp_path, capsys):
    for name in ("ROFU@eta=abc", "Greedy-matched@nope=1", "Nope", "ROFU@fit_opt=lbfgs"):
        with pytest.raises(SystemExit) as exc:
            main(["--policies", name, "--out", str(tmp_path)])
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_replay_runs_on_the_cpu_unless_told_otherwise():
    # One context per round leaves a GPU launch-bound: on an H100 ROFU took 62 ms per round
    # there against 46 ms on one CPU core (benchmarks/RESULTS.md), so `auto` is opt-in.
    assert build_parser().parse_args([]).device == "cpu"
    assert build_parser().parse_args(["--device", "auto"]).device == "auto"


def test_parse_seeds():
    assert parse_seeds("0-3") == (0, 1, 2, 3)
    assert parse_seeds("1,5,7-8") == (1, 5, 7, 8)
    with pytest.raises(Exception, match="seeds must look like"):
        parse_seeds("a-b")


def test_replay_preset_is_chosen_explicitly_and_recorded(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--datasets", "wheel", "--policies", "ROFU,LinUCB", "--seeds", "0", "--rounds", "40"]
    assert main([*argv, "--preset", "linear", "--out", str(out), "--no-progress"]) == 0
    rofu = RunSummary.load(out / "runs" / "wheel" / "ROFU" / "seed0-T40-linear.json")
    assert rofu.preset == "linear"
    assert rofu.config is not None
    assert rofu.config["net"]["activation"] == "identity"
    linucb = RunSummary.load(out / "runs" / "wheel" / "LinUCB" / "seed0-T40.json")
    assert (linucb.preset, linucb.config["class"]) == ("", "LinUCB")
    report = (out / "README.md").read_text()
    assert "ROFU preset each cell ran" in report
    assert "`linear`" in report
    capsys.readouterr()
    for bad, message in (
        ("fancy", "unknown preset 'fancy'"),
        ("adult=linear", "--preset names data sets that do not run: adult"),
    ):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--preset", bad, "--out", str(tmp_path / "bad")])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_replay_http_says_how_to_start_a_service_shaped_for_the_bandit(
    tmp_path, capsys, monkeypatch
):
    import shlex

    import httpx

    import rofu.replay.http_run as http_run
    import rofu.replay.simulation.http_driver as http_driver
    from rofu.client import RofuClient
    from rofu.replay.simulation.bandits import MLPBandit
    from rofu.service.settings import Settings

    command = http_driver.serve_command(MLPBandit())
    for word in shlex.split(command):
        if "=" in word:
            monkeypatch.setenv(*word.split("=", 1))
    settings = Settings()  # what `rofu serve` would read from that environment
    assert settings.context_dim == MLPBandit().context_dim
    assert len(settings.arms) == settings.max_arms == MLPBandit().n_arms
    # and it learns within seconds of the rounds: its own trainer, a 1 s window, a run a second
    assert settings.in_process_trainer
    assert settings.reward_window_seconds == settings.train_interval_seconds == 1.0

    def misfit(request: httpx.Request) -> httpx.Response:  # the demo service: 8 features, 4 arms
        if request.url.path == "/v1/arms":
            arms = [
                {"id": f"arm-{i}", "slot": i, "features": None, "active": True} for i in range(4)
            ]
            return httpx.Response(200, json=arms)
        model = {"version": 0, "checksum": None, "created_at": None, "age_seconds": None}
        body = model | {"n_data": 0, "network": {"context_dim": 8}, "rofu": {}}
        return httpx.Response(200, json=body | {"feature_hash_seed": 0})

    monkeypatch.setattr(
        http_run,
        "RofuClient",
        lambda url, **kw: RofuClient(url, transport=httpx.MockTransport(misfit), **kw),
    )
    argv = ["--http", "http://127.0.0.1:9", "--datasets", "mlp", "--seeds", "0", "--rounds", "5"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the service has context_dim 8 and 4 active arms; mlp needs 10 and 10" in err
    assert "ROFU_CONTEXT_DIM=10" in err
    assert "ROFU_REWARD_WINDOW_SECONDS=1" in err


def test_policy_names_match_without_regard_to_case():
    from rofu.replay.simulation.policies import canonical_policy_name

    assert canonical_policy_name("rofu-ntk") == "ROFU-NTK"
    assert canonical_policy_name("linucb") == "LinUCB"
    assert canonical_policy_name("greedy-MATCHED@fit_lr=0.01") == "Greedy-matched@fit_lr=0.01"
    assert canonical_policy_name("Rofu@eta=2") == "ROFU@eta=2"
    for bad in ("nope", "LinUCB@eta=1", "rofu@eta=abc"):
        with pytest.raises(ValueError, match="unknown policy|bad value"):
            canonical_policy_name(bad)
