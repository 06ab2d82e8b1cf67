"""Running many (data set, policy, seed) jobs: resumable, in parallel, with a progress bar.

Each finished job is one summary, `<out>/runs/<bandit>/<policy>/seed<seed>-T<rounds>.json`
(with `-<preset>` and `-<learner>` where the job names them; `rofu.replay.simulation.summary`),
written after its full per-round arrays, `<out>/cache/...npz` (ignored by git). A rerun
skips every job whose summary exists, and refuses one that is corrupt or was made by
another job, so an interrupted protocol resumes where it stopped. Jobs run in
`workers` spawned processes (torch threads split between them); a failed job stops the
protocol without starting the queued ones, and on Linux the workers die with the process
that started them, even a killed one.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from rofu.models.presets import PRODUCT, get_preset
from rofu.replay.runs import run_name
from rofu.replay.simulation.bandits import Bandit
from rofu.replay.simulation.datafile import ClassificationFile
from rofu.replay.simulation.oracle import ORACLE, OracleConfig, oracle_for, regret_two
from rofu.replay.simulation.simulate import RunResult, simulate
from rofu.replay.simulation.summary import RunSummary

if TYPE_CHECKING:
    from rofu.models.policies import Policy


@dataclass(frozen=True)
class Protocol:
    """How many rounds and seeds, on which data sets, with which policies.

    Attributes:
        policies: what runs when `--policies` names none; empty: every built-in policy.
        learners: data set -> the learner (`rofu.replay.simulation.learners`) its neural policies
        run on.
    """

    name: str
    rounds: int
    seeds: tuple[int, ...]
    datasets: tuple[str, ...]
    policies: tuple[str, ...] = ()
    learners: dict[str, str] = field(default_factory=dict)


PAPER_DATASETS = ("census", "jester", "adult", "covertype", "statlog", "financial", "mushroom")
#: The paper's section 5.1: ROFU at M = 1, 5, 10 against epsilon-greedy (and Greedy), on the
#: paper's learner of each bandit.
ABLATION = Protocol(
    "ablation",
    1_000,
    tuple(range(4)),
    ("mlp", "resnet"),
    ("ROFU@steps=1", "ROFU@steps=5", "ROFU@steps=10", "EpsilonGreedy", "Greedy"),
    {"mlp": "paper-mlp", "resnet": "paper-resnet32"},
)
PROTOCOLS = {
    "quick": Protocol("quick", 2_000, tuple(range(4)), (*PAPER_DATASETS, "wheel", "mlp")),
    "paper": Protocol("paper", 20_000, tuple(range(16)), PAPER_DATASETS),
    "ablation": ABLATION,
}
TUNING_SEEDS = tuple(range(1000, 1004))  # disjoint from every reported seed


@dataclass(frozen=True)
class Job:
    """One run to make."""

    bandit: str
    policy: str
    seed: int
    rounds: int
    preset: str = PRODUCT.name  # ROFU's preset (rofu.models.presets) for ROFU-family policies
    learner: str = (
        ""  # the data set's learner (rofu.replay.simulation.learners), if the protocol names one
    )

    def path(self, out: Path) -> Path:
        """Where its summary goes (a preset other than the product's, and a learner, are in
        the name)."""
        tag = "" if self.preset == PRODUCT.name else f"-{self.preset}"
        tag += f"-{self.learner}" if self.learner else ""
        return out / "runs" / self.bandit / self.policy / run_name(self.seed, self.rounds, tag)

    def cache_path(self, out: Path) -> Path:
        """Where its full per-round arrays go (`RunResult.save`; git-ignored)."""
        summary = self.path(out)
        return out / "cache" / summary.relative_to(out / "runs").with_suffix(".npz")

    def done(self, out: Path) -> bool:
        """Whether its summary exists.

        Raises:
            ValueError: the summary is corrupt, or another job made it.
        """
        path = self.path(out)
        if not path.exists():
            return False
        made_by = RunSummary.load(path).job
        if made_by != asdict(self):
            raise ValueError(
                f"{path} holds the run of {made_by}, not of {asdict(self)}: delete it to run "
                "it again, or use a fresh --out"
            )
        return True


def jobs_for(
    datasets: Iterable[str],
    policies: Iterable[str],
    seeds: Iterable[int],
    rounds: int,
    presets: Mapping[str, str] | None = None,
    learners: Mapping[str, str] | None = None,
) -> list[Job]:
    """Every combination, seed by seed (so a protocol stopped part way has every data set
    and policy at the seeds it finished); `presets` maps a data set to the preset its
    ROFU-family policies run (the product's where it names none), `learners` to the
    learner its neural policies run on (`rofu.replay.simulation.learners`; none where it names
    none).

    `ROFU-tuned` runs the data set's tuned preset (`TUNED_PRESETS`), and only where that
    differs from the preset ROFU runs there: elsewhere its runs would repeat ROFU's bit for
    bit, so it has no job and the report takes ROFU's cell for it (`rofu.replay.reports.tuned`).
    """
    from rofu.replay.simulation.policies import TUNED_POLICY, TUNED_PRESETS, resolve_preset

    presets, learners = presets or {}, learners or {}

    def preset(dataset: str, policy: str) -> str | None:
        """The preset a job runs; None: no job (ROFU-tuned where it would repeat ROFU)."""
        if policy == TUNED_POLICY:
            tuned = TUNED_PRESETS.get(dataset)
            repeats = tuned in (None, preset(dataset, "ROFU")) or dataset in learners
            return None if repeats else tuned
        if resolve_preset(policy) is None:
            return PRODUCT.name
        return presets.get(dataset, PRODUCT.name)

    return [
        Job(d, p, s, rounds, name, learners.get(d, ""))
        for s in seeds
        for d in datasets
        for p in policies
        if (name := preset(d, p)) is not None
    ]


@lru_cache(maxsize=8)  # a seed's jobs visit every data set of a protocol (7 in `paper`)
def _bandit(source: str | ClassificationFile, data_dir: str | None) -> Bandit:
    from rofu.replay.simulation.datasets import load_bandit

    return load_bandit(source, None if data_dir is None else Path(data_dir))


def run_job(
    job: Job,
    out: Path,
    data_dir: str | None,
    device: str,
    file: ClassificationFile | None = None,
    oracle: OracleConfig | None = ORACLE,
    *,
    oracle_cache: Path | None = None,
) -> Path:
    """Run one job and write its full arrays, then its summary (in a worker process or
    in-process); `file` is the user's classification file when the job's data set is it.
    With an `oracle` recipe the run gets its regret II (`rofu.replay.simulation.oracle`;
    the oracle is cached under `oracle_cache`, by default `<out>/cache/oracle`)."""
    bandit = _bandit(job.bandit if file is None else file, data_dir)
    policy, config = job_policy(job, bandit, torch.device(device))
    stream = bandit.stream(job.rounds, job.seed)
    result: RunResult = simulate(
        policy, stream, bandit=job.bandit, policy_name=job.policy, seed=job.seed, config=config
    )
    net = (
        None
        if oracle is None
        else oracle_for(bandit, stream, job.seed, oracle, oracle_cache or out / "cache" / "oracle")
    )
    if net is not None:
        result = replace(result, regret2=regret_two(net, stream, result.arms))
    result.save(job.cache_path(out))
    path = job.path(out)
    RunSummary.of(result, asdict(job)).save(path)  # last: a summary marks the job done
    return path


def job_policy(job: Job, bandit: Bandit, device: torch.device) -> tuple[Policy, dict[str, Any]]:
    """The job's policy, on its learner or preset, and the configuration it records."""
    from rofu.replay.simulation.learners import get_learner
    from rofu.replay.simulation.policies import (
        build_policy,
        configuration,
        resolve_learner,
        resolve_preset,
    )

    shape, arms = bandit.context_shape, bandit.n_arms
    if job.learner:
        if job.preset != PRODUCT.name:
            raise ValueError(f"{job.bandit} runs learner {job.learner}; a preset does not apply")
        learner = get_learner(job.learner)
        learner.check(job.bandit, shape, arms)
        policy = build_policy(
            job.policy, bandit.context_dim, arms, job.seed, device, learner=learner
        )
        return policy, configuration(policy, resolve_learner(job.policy, learner) or learner)
    preset = get_preset(job.preset)
    policy = build_policy(job.policy, bandit.context_dim, arms, job.seed, device, preset=preset)
    return policy, configuration(policy, resolve_preset(job.policy, preset))


PR_SET_PDEATHSIG = 1  # prctl(2)


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    if sys.platform == "linux":  # die with the parent, even a killed one, not run on orphaned
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def resolve_device(name: str) -> str:
    """`auto`: CUDA when available (neural policies then run there), else CPU."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return name


def run_jobs(
    jobs: Sequence[Job],
    out: Path,
    *,
    workers: int = 1,
    data_dir: Path | None = None,
    device: str = "cpu",
    progress: bool = True,
    files: Sequence[ClassificationFile] = (),
    oracle: OracleConfig | None = ORACLE,
) -> list[Path]:
    """Run every job whose summary is missing; return every job's summary path.

    A job whose data set is named like one of `files` (the user's classification files)
    runs on that file; the others on the registered data set of their name. `oracle`: the
    recipe of the regret II oracle (None: no regret II).
    """
    device = resolve_device(device)
    todo = [job for job in jobs if not job.done(out)]
    folder = None if data_dir is None else str(data_dir)
    by_name = {file.name: file for file in files}
    bar = tqdm(
        total=len(jobs),
        initial=len(jobs) - len(todo),
        disable=not progress,
        desc="replay",
        unit="run",
    )
    try:
        if workers <= 1:
            for job in todo:
                bar.set_postfix_str(f"{job.bandit}/{job.policy}/seed{job.seed}")
                run_job(job, out, folder, device, by_name.get(job.bandit), oracle)
                bar.update()
        else:
            threads = max(1, (os.cpu_count() or 1) // workers)
            with ProcessPoolExecutor(
                workers,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(threads,),
            ) as pool:
                futures = [
                    pool.submit(run_job, job, out, folder, device, by_name.get(job.bandit), oracle)
                    for job in todo
                ]
                try:
                    for future in as_completed(futures):
                        future.result()  # a failed job stops the protocol with its error
                        bar.update()
                except BaseException:  # start no queued job; running ones finish, files kept
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        bar.close()
    return [job.path(out) for job in jobs]
