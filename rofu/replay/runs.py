"""Which saved runs a report reads: the run summaries under `<out>/runs` (JSON, committed;
the full per-round arrays are in `<out>/cache`, ignored), by data set and policy, narrowed
to the seeds, data sets and policies a command names."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from rofu.replay.simulation.summary import RunSummary


@dataclass(frozen=True)
class Selection:
    """Which saved runs a report covers: those of the seeds, data sets and policies its
    command names, so that a report rebuilt from the runs on disk holds what a rerun of its
    command from a clean clone would (None: any)."""

    seeds: frozenset[int] | None = None
    datasets: frozenset[str] | None = None
    policies: frozenset[str] | None = None

    def admits(self, run: RunSummary) -> bool:
        return (
            (self.seeds is None or run.seed in self.seeds)
            and (self.datasets is None or run.bandit in self.datasets)
            and (self.policies is None or run.policy in self.policies)
        )

    def describe(self) -> str:
        """The selection in words, for an error that found no run in it."""
        parts = [
            f"{what} {', '.join(str(v) for v in sorted(values))}"
            for what, values in (
                ("seeds", self.seeds),
                ("data sets", self.datasets),
                ("policies", self.policies),
            )
            if values is not None
        ]
        return f" of {'; '.join(parts)}" if parts else ""


EVERY_RUN = Selection()

# seed<s>-T<rounds>.json, or seed<s>-T<rounds>-<tag>.json where the run names a preset other
# than the product's, or a learner; never <name>.json.partial.json, a summary still being
# written (`RunSummary.save`)
_RUN_NAME = re.compile(r"seed(\d+)-T(\d+)(-[^.]+)?")


def run_name(seed: int, rounds: int, tag: str = "") -> str:
    """The file name of one run's summary (`tag`: "" or "-<preset>", "-<learner>", both in
    turn); a name `seed_and_rounds` would not read back is refused, so `collect` finds every
    run."""
    name = f"seed{seed}-T{rounds}{tag}.json"
    if seed_and_rounds(Path(name)) != (seed, rounds):
        raise ValueError(f"a run file's tag is '-' then a name with no dot, not {tag!r}")
    return name


def seed_and_rounds(path: Path) -> tuple[int, int] | None:
    """The seed and T a run file's name gives (None: not a run file's name)."""
    found = _RUN_NAME.fullmatch(path.stem)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


def collect(
    out: Path, rounds: int | None = None, only: Selection = EVERY_RUN
) -> dict[str, dict[str, list[RunSummary]]]:
    """Every run summary under `out/runs`, by bandit then policy (optionally one T only, and
    only the runs `only` admits).

    Raises:
        ValueError: a summary is corrupt, two summaries hold the same run, or `out/runs`
            holds full run files (.npz) of an older version, not summaries.
    """
    older = next((out / "runs").glob("*/*/seed*-T*.npz"), None)
    if older is not None:
        raise ValueError(
            f"{older} is a full run file, not a summary: convert {out} once with "
            f"`rofu replay --compact --out {out}`"
        )
    results: dict[str, dict[str, list[RunSummary]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted((out / "runs").glob("*/*/seed*-T*.json")):
        named = seed_and_rounds(path)
        if named is None or (rounds is not None and named[1] != rounds):
            continue
        if only.seeds is not None and named[0] not in only.seeds:
            continue
        run = RunSummary.load(path)
        if not only.admits(run):
            continue
        runs = results[run.bandit][run.policy]
        if any(other.seed == run.seed and other.rounds == run.rounds for other in runs):
            raise ValueError(
                f"{out}: two runs of {run.policy} on {run.bandit}, seed {run.seed}, "
                f"T = {run.rounds} (different presets); a report takes one: use a fresh --out"
            )
        runs.append(run)
    return {b: dict(p) for b, p in results.items()}
