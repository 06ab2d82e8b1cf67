"""A study as a plan: its list of runs, how many are done, and disjoint shards of it.

The run file is the contract: a run is done when its summary exists under `--out`
(`Job.done`), whoever made it. So a study can be split into N shards that any scheduler
runs separately and in any order (a Kubernetes Indexed Job's `JOB_COMPLETION_INDEX`, a
Slurm array's `SLURM_ARRAY_TASK_ID`): `rofu replay ... --shard I/N` runs the I-th slice of
the plan into the shared `--out`, and once every slice is done `--report-only` builds the
report from the run files alone, the same report `--workers` would have built.

Slices are balanced by each run's expected cost (`expected_cost`) with the longest-first
rule: runs are taken in decreasing cost (ties in plan order) and each goes to the slice
with the least cost so far (ties to the lowest index). The slicing depends on the plan
only, never on what is done, so every shard of one command agrees on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from rofu.replay.runner import Job

#: CPU per round of a ROFU-family run against any other (measured at T = 20 000: `ROFU`
#: 801 CPU s on Adult against 310 for `Greedy-matched`; results/tuning/closed-prior-long).
ROFU_COST = 3.0


@dataclass(frozen=True)
class Shard:
    """The `index`-th (0-based) of `count` slices of a plan."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`I/N` with 0 <= I < N.

        Raises:
            argparse.ArgumentTypeError: anything else, saying what is expected.
        """
        parts = text.split("/")
        try:
            index, count = (int(part) for part in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--shard takes I/N (e.g. 0/4, the first of four), got {text!r}"
            ) from None
        if count < 1 or not 0 <= index < count:
            raise argparse.ArgumentTypeError(
                f"--shard {text}: the index must be in 0..N-1 and N >= 1 (0-based, as "
                "JOB_COMPLETION_INDEX)"
            )
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def expected_cost(job: Job) -> float:
    """A run's expected cost, in rounds of a plain policy: T, `ROFU_COST` times for a
    ROFU-family policy (one whose name resolves to a preset)."""
    from rofu.replay.simulation.policies import resolve_preset

    return job.rounds * (ROFU_COST if resolve_preset(job.policy) is not None else 1.0)


def slices(jobs: Sequence[Job], count: int) -> list[list[Job]]:
    """The plan cut into `count` disjoint slices of about equal expected cost, each in
    plan order."""
    order = sorted(range(len(jobs)), key=lambda i: (-expected_cost(jobs[i]), i))
    loads, owner = [0.0] * count, [0] * len(jobs)
    for i in order:
        target = min(range(count), key=lambda s: (loads[s], s))
        owner[i] = target
        loads[target] += expected_cost(jobs[i])
    return [[job for i, job in enumerate(jobs) if owner[i] == s] for s in range(count)]


def shard_of(jobs: Sequence[Job], shard: Shard) -> list[Job]:
    """The jobs of one shard, in plan order."""
    return slices(jobs, shard.count)[shard.index]


def plan_text(jobs: Sequence[Job], finished: Set[Job], out: Path, shards: int | None = None) -> str:
    """The plan as text: one line per run (done when in `finished`, else pending; its run
    file), then the counts; with `shards`, each run's shard and each shard's counts and
    expected cost."""
    parts = [] if shards is None else slices(jobs, shards)
    owner = {job: index for index, part in enumerate(parts) for job in part}
    lines = []
    for job in jobs:
        state = "done   " if job in finished else "pending"
        where = f"  shard {owner[job]}/{shards}" if shards is not None else ""
        lines.append(f"{state}  {job.path(out)}{where}")
    done = sum(job in finished for job in jobs)
    lines.append(f"{len(jobs)} runs: {done} done, {len(jobs) - done} pending, under {out}")
    for index, part in enumerate(parts):
        cost = sum(expected_cost(job) for job in part)
        lines.append(
            f"shard {index}/{shards}: {len(part)} runs ({sum(j in finished for j in part)} "
            f"done), expected cost {cost:,.0f} plain rounds"
        )
    return "\n".join(lines)


def merge_runs(folders: Sequence[Path], out: Path) -> int:
    """Copy the run files of shard folders (each an `--out` of some shards) into `out`;
    return how many were new. A run file `out` already holds with the same bytes is kept.

    Raises:
        ValueError: a folder has no `runs/`, or two copies of one run file differ (two
            different runs under one name), naming both; nothing is copied then.
    """
    copies: dict[Path, Path] = {}
    for folder in folders:
        runs = folder / "runs"
        if not runs.is_dir():
            raise ValueError(f"{folder} holds no runs/ folder: not the --out of a shard")
        for path in sorted(runs.rglob("*.json")):
            target = out / path.relative_to(folder)
            seen = copies.get(target)
            known = seen if seen is not None else (target if target.exists() else None)
            if known is not None and known.read_bytes() != path.read_bytes():
                raise ValueError(f"{known} and {path} are two different runs under one name")
            copies.setdefault(target, path)
    new = 0
    for target, path in copies.items():
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
            new += 1
    return new
