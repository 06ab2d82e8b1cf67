"""`rofu replay --compact --out DIR`: turn a study's full run files into summaries, once.

Before summaries, a study kept one .npz of per-round arrays per run under `DIR/runs`. This
writes each one's summary (`rofu.replay.simulation.summary`) beside it, then moves the .npz
into `DIR/cache` (git-ignored), where the runner now writes them. The job a summary records
is read off the file's path (data set, policy, seed, T and the tag naming a preset or a
learner), so a resumed study finds every converted run done. Running it again converts
nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from rofu.models.presets import PRESETS, PRODUCT
from rofu.replay.runner import Job
from rofu.replay.runs import seed_and_rounds
from rofu.replay.simulation.learners import LEARNERS
from rofu.replay.simulation.simulate import RunResult
from rofu.replay.simulation.summary import RunSummary


def compact(out: Path) -> list[Path]:
    """Convert every full run file under `out/runs`; return the summaries written.

    Raises:
        ValueError: a file's name names no job, or its content another run.
    """
    written = []
    for path in sorted((out / "runs").glob("*/*/seed*-T*.npz")):
        job = job_of(path)
        run = RunResult.load(path)
        if (run.bandit, run.policy, run.seed, run.rounds) != (
            job.bandit,
            job.policy,
            job.seed,
            job.rounds,
        ):
            raise ValueError(f"{path} holds {run.policy} on {run.bandit}, seed {run.seed}")
        if job.path(out).exists():  # converted, then the .npz came back: keep the summary
            raise ValueError(f"{path}: {job.path(out)} exists already; remove one of them")
        RunSummary.of(run, asdict(job)).save(job.path(out))
        cache = job.cache_path(out)
        cache.parent.mkdir(parents=True, exist_ok=True)
        path.replace(cache)
        written.append(job.path(out))
    return written


def job_of(path: Path) -> Job:
    """The job whose full run file `path` (`<out>/runs/<bandit>/<policy>/<name>.npz`) is."""
    named = seed_and_rounds(path)
    if named is None:
        raise ValueError(f"{path} is not named like a run file (seed<s>-T<rounds>[-<tag>])")
    seed, rounds = named
    tag = path.stem.removeprefix(f"seed{seed}-T{rounds}").removeprefix("-")
    preset, learner = _preset_and_learner(tag, path)
    job = Job(path.parent.parent.name, path.parent.name, seed, rounds, preset, learner)
    if job.path(Path()).name != path.with_suffix(".json").name:
        raise ValueError(f"{path}: its tag {tag!r} reads back as another name")
    return job


def _preset_and_learner(tag: str, path: Path) -> tuple[str, str]:
    """A run file's tag: "", a preset, a learner, or `<preset>-<learner>`."""
    if not tag:
        return PRODUCT.name, ""
    if tag in PRESETS:
        return tag, ""
    if tag in LEARNERS:
        return PRODUCT.name, tag
    for learner in LEARNERS:
        preset = tag.removesuffix(f"-{learner}")
        if preset != tag and preset in PRESETS:
            return preset, learner
    raise ValueError(f"{path}: its tag {tag!r} names no preset or learner")
