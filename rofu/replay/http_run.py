"""`rofu replay --http URL`: the streams played against a live service.

Before each run it reads the service's settings and says on stderr what they imply
(`rofu.replay.simulation.http_plan`), refusing a run that would measure only the cold
start. Each run's figures (regret, latency, the share of its decisions the cold-start
policy made and the model versions that made the others) go to stdout as a JSON line, to
`<out>/http/results.json` and to the report `<out>/http/README.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rofu.client import RofuClient, RofuError
from rofu.replay.runs import run_name
from rofu.replay.simulation.bandits import Bandit
from rofu.replay.simulation.datafile import ClassificationFile
from rofu.replay.simulation.http_driver import HttpRun, NoModel, play, serve_command, service_arms
from rofu.replay.simulation.http_plan import DEFAULT_WAIT_S, Meaningless, Plan, SyncMode, plan
from rofu.replay.simulation.simulate import WARM_START

REPORT = "README.md"


@dataclass(frozen=True)
class Study:
    """What one `rofu replay --http` command runs, and where it writes."""

    url: str
    rounds: int
    out: Path  # <out>/http
    command: str  # the command line, for the report
    sync: SyncMode = "every"
    wait_s: float = DEFAULT_WAIT_S
    allow_cold_start: bool = False
    api_key: str | None = None  # ROFU_API_KEY, for a service with keys


@dataclass(frozen=True)
class Done:
    """A finished run and what its preflight said."""

    dataset: str
    seed: int
    run: HttpRun
    said: tuple[str, ...]

    def figures(self) -> dict[str, object]:
        """Its entry of results.json (and its line on stdout)."""
        result = self.run.result
        return {
            "dataset": self.dataset,
            "seed": self.seed,
            "rounds": result.rounds,
            "pseudo_regret": result.final_pseudo_regret,
            "regret": result.final_regret,
            **self.run.learning(),
            **self.run.percentiles(),
        }


def run_http(
    parser: argparse.ArgumentParser,
    study: Study,
    datasets: tuple[str, ...],
    seeds: tuple[int, ...],
    file: ClassificationFile | None = None,
    data_dir: Path | None = None,
) -> int:
    """Play every data set and seed against the service; 1 where a run got no model."""
    from rofu.replay.simulation.datasets import load_bandit

    done: list[Done] = []
    for name in datasets:
        bandit = load_bandit(file if file is not None and name == file.name else name, data_dir)
        for seed in seeds:
            checked = _preflight(parser, study, bandit)
            print(f"{name}, seed {seed}, T = {study.rounds}, at {study.url}:", file=sys.stderr)
            for line in checked.lines:
                print(line, file=sys.stderr)
            try:
                run = _play(parser, study, bandit, seed, checked)
            except NoModel as exc:
                print(f"rofu replay: error: {exc}", file=sys.stderr)
                return 1
            run.result.save(
                study.out / name / run_name(seed, study.rounds).replace(".json", ".npz")
            )
            done.append(Done(name, seed, run, checked.lines + run.notes))
            print(json.dumps(done[-1].figures()))
            _write(study, done)
    print(study.out / REPORT)
    return 0


def _preflight(parser: argparse.ArgumentParser, study: Study, bandit: Bandit) -> Plan:
    """The run's plan from the service's settings; a usage error where it is refused."""
    warm = min(WARM_START * bandit.n_arms, study.rounds)
    try:
        with RofuClient(study.url, api_key=study.api_key) as client:
            model = client.model()
            service_arms(client, bandit, model)
        return plan(model, study.rounds, warm, study.sync, study.wait_s, study.allow_cold_start)
    except Meaningless as exc:
        parser.error(str(exc))
    except ValueError as exc:  # the service is not shaped for the bandit
        parser.error(f"{exc}; start a service for it with:\n  {serve_command(bandit)}")
    except RofuError as exc:
        parser.error(f"the service at {study.url} answered {exc}")


def _play(
    parser: argparse.ArgumentParser, study: Study, bandit: Bandit, seed: int, checked: Plan
) -> HttpRun:
    try:
        stream = bandit.stream(study.rounds, seed)
        return play(study.url, bandit, stream, seed, sync=checked.sync, api_key=study.api_key)
    except ValueError as exc:  # the service changed shape since the preflight
        parser.error(f"{exc}; start a service for it with:\n  {serve_command(bandit)}")
    except RofuError as exc:
        parser.error(f"the service at {study.url} answered {exc}")


def _write(study: Study, done: list[Done]) -> None:
    study.out.mkdir(parents=True, exist_ok=True)
    figures = [run.figures() for run in done]
    (study.out / "results.json").write_text(json.dumps(figures, indent=2))
    (study.out / REPORT).write_text(report(study, done))


def report(study: Study, done: list[Done]) -> str:
    """The markdown report of the runs: a row each, then what the service's settings
    implied for each run, as its preflight said."""
    waits = "no waits" if study.sync == "none" else f"waits of at most {study.wait_s:g} s"
    lines = [
        "# Replay against a live service",
        "",
        f"`{study.command}` against {study.url}: T = {study.rounds} rounds, "
        f"`--http-sync {study.sync}` ({waits}).",
        "",
        "| data set | seed | regret | pseudo-regret | cold-start share | models that decided "
        "(rounds) | waits (s) | select p50 / p99 ms | reward p50 / p99 ms |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
        *(_row(one) for one in done),
        "",
        "The cold-start share and the models are those of the rounds after the warm start "
        "(its first rounds force the round-robin arm, here as in process). A cold-start "
        "decision is uniform over the arms: the service had no model yet.",
        "",
        *(warning for one in done if (warning := _warning(one))),
        "## Models that decided",
        "",
        "Rounds after the warm start that each model version decided (v0: the cold start).",
        "",
        *(
            f"- {one.dataset}, seed {one.seed}: {served_text(one.run.served_versions(), None)}"
            for one in done
        ),
        "",
        "## What the service's settings implied",
        "",
    ]
    for one in done:
        lines += [f"- **{one.dataset}, seed {one.seed}**", *(f"  - {line}" for line in one.said)]
    return "\n".join(lines) + "\n"


def _row(one: Done) -> str:
    run, result = one.run, one.run.result
    share = run.cold_start_share()
    share_text = "-" if share is None else f"{share:.2f} of {run.decided_rounds}"
    ms = run.percentiles()
    return (
        f"| {one.dataset} | {one.seed} | {result.final_regret:.1f} "
        f"| {result.final_pseudo_regret:.1f} | {share_text} "
        f"| {served_text(run.served_versions())} | {len(run.waits)} ({sum(run.waits):.1f}) "
        f"| {ms['select_p50_ms']:.1f} / {ms['select_p99_ms']:.1f} "
        f"| {ms['reward_p50_ms']:.1f} / {ms['reward_p99_ms']:.1f} |"
    )


def served_text(versions: dict[int, int], most: int | None = 6) -> str:
    """`v0: 30, v1: 50, ...`; past `most` versions (None: no limit), the first three and
    the last two."""
    items = [f"v{version}: {n}" for version, n in versions.items()]
    if most is not None and len(items) > most:
        items = [*items[:3], "...", *items[-2:]]
        return f"{len(versions)} versions: " + ", ".join(items)
    return ", ".join(items) or "-"


def _warning(one: Done) -> str:
    """A line in bold where most decided rounds were the cold start ("" elsewhere)."""
    share = one.run.cold_start_share()
    if share is None or share < 0.5:
        return ""
    where = f"{one.dataset}, seed {one.seed}"
    if share == 1.0:
        return f"**{where}: every decided round was the cold start: it measures no model.**\n"
    return f"**{where}: {share:.0%} of its decided rounds were the cold start.**\n"
