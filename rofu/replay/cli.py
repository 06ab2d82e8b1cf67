"""`rofu replay`: run a protocol (or parts of it) and write the report; `--http URL`
plays the streams against a live service instead; `--combine A,B` builds one report at
`--out` from the reports written in folders A and B (B's cells win where both have one);
`--compact --out DIR` converts the full run files of a study made before runs were kept as
summaries.
`--dataset-file PATH --label-column N` adds a classification file of your own (numeric
features; N 0-based, -1 the last column) as a data set. Data sets, their files and the
policies are checked before anything runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rofu.models.presets import PRODUCT
from rofu.replay.arguments import (
    DEFAULT_OUT,
    build_parser,
    checked_datasets,
    command_text,
    http_options,
    named_datasets,
)
from rofu.replay.plan import merge_runs, plan_text, shard_of
from rofu.replay.runner import PROTOCOLS, Job, Protocol, jobs_for, resolve_device, run_jobs
from rofu.replay.simulation.datafile import ClassificationFile
from rofu.replay.simulation.policies import BUILT_IN, TUNED_PRESETS, canonical_policy_name


def main(argv: list[str] | None = None) -> int:
    """Entry point of `rofu replay`."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    protocol = PROTOCOLS[args.protocol]
    seeds = args.seeds or protocol.seeds
    rounds = args.rounds or protocol.rounds
    if rounds < 1 or args.workers < 1:
        parser.error("--rounds and --workers must be >= 1")
    _check_backend(parser, args)
    if args.combine:
        return _combine(parser, args, argv)
    if args.compact:
        return _compact(parser, args)
    out = args.out or DEFAULT_OUT / args.protocol
    http_options(parser, args)
    if args.http and args.report_only:
        parser.error("--report-only rebuilds a report from run files; it does not go with --http")
    try:  # matched without regard to case; run files and reports use the canonical name
        names = args.policies or protocol.policies or BUILT_IN
        policies = tuple(canonical_policy_name(name) for name in names)
    except ValueError as exc:
        parser.error(str(exc))
    spec = (policies, seeds, rounds)
    if args.plan or args.shard or args.merge:
        _check_plan_flags(parser, args)
        _merge(parser, args, out)  # with --merge: gather the runs, then as --report-only
        if args.plan:  # nothing runs and no data is read
            jobs, finished = _finished(parser, args, protocol, spec, out)
            shards = None if args.shard is None else args.shard.count
            print(plan_text(jobs, finished, out, shards))
            return 0
    # --report-only, or a study whose every run has its summary: no data needed
    done = args.report_only or (not args.http and _all_done(parser, args, protocol, spec, out))
    datasets, file = checked_datasets(parser, args, protocol, files=not done)
    if args.http:
        from rofu.replay.http_run import Study, run_http

        options = (args.http_sync, args.http_wait, args.http_allow_cold_start)
        key = os.environ.get("ROFU_API_KEY") or None  # a client key of the service, if any
        study = Study(args.http, rounds, out / "http", command_text(argv), *options, key)
        return run_http(parser, study, datasets, seeds, file, args.data_dir)
    named = (datasets, policies, seeds, rounds)
    if not args.report_only and not _run(parser, args, protocol, named, file, out):
        return 0  # a shard's runs are done, and other shards' are still to come
    return _report(parser, args, argv, protocol, datasets, policies, seeds, rounds, out)


def _run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    protocol: Protocol,
    study: tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], int],
    file: ClassificationFile | None,
    out: Path,
) -> bool:
    """Run the pending runs of the study (data sets, policies, seeds, rounds), with --shard
    only its slice's; whether every run of the study is now done."""
    datasets, policies, seeds, rounds = study
    presets = _preset_of(parser, args, datasets, protocol)
    plan = jobs_for(datasets, policies, seeds, rounds, presets, protocol.learners)
    jobs = plan if args.shard is None else shard_of(plan, args.shard)
    files = () if file is None else (file,)
    if args.backend == "ray":
        _run_ray(parser, args, jobs, out, files)
    else:
        run_jobs(
            jobs,
            out,
            workers=args.workers,
            data_dir=args.data_dir,
            device=args.device,
            progress=not args.no_progress,
            files=files,
        )
    pending = [job for job in plan if not job.done(out)]
    if pending:
        which = "this command's runs" if args.shard is None else f"shard {args.shard}"
        print(
            f"{which} done; {len(pending)} of the study's {len(plan)} runs are "
            f"still pending under {out} (--plan lists them); once they are done, "
            "--report-only builds the report"
        )
    return not pending


def _check_backend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--address and --retries only with --backend ray, which runs no --workers pool."""
    if args.backend != "ray":
        for flag, value in (("--address", args.address), ("--retries", args.retries)):
            if value is not None:
                parser.error(f"{flag} goes only with --backend ray")
        return
    if args.workers > 1:
        parser.error("--backend ray runs one task per run: --workers does not apply")
    if args.http:
        parser.error("--backend ray runs the replay's own policies: not with --http")
    if args.retries is not None and args.retries < 0:
        parser.error("--retries must be >= 0")


def _run_ray(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    jobs: list[Job],
    out: Path,
    files: tuple[ClassificationFile, ...],
) -> None:
    """--backend ray: the pending runs as Ray tasks; a run that failed every retry is
    reported, and the command exits 1 once the others are done."""
    from rofu.replay.ray_backend import RayUnavailable, run_on_ray

    try:
        outcome = run_on_ray(
            jobs,
            out,
            address=args.address,
            retries=2 if args.retries is None else args.retries,
            data_dir=args.data_dir,
            device=resolve_device(args.device),
            files=files,
            progress=not args.no_progress,
        )
    except RayUnavailable as exc:
        parser.error(str(exc))
    if outcome.failed:
        for job, why in outcome.failed:
            print(f"rofu replay: {job.path(out)} failed: {why}", file=sys.stderr)
        raise SystemExit(1)


def _report(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: list[str],
    protocol: Protocol,
    datasets: tuple[str, ...],
    policies: tuple[str, ...],
    seeds: tuple[int, ...],
    rounds: int,
    out: Path,
) -> int:
    """Write the report of the runs under `out` that the command names."""
    from rofu.replay.reports.report import report_title, write_report
    from rofu.replay.runs import Selection

    # The report holds only the runs of the seeds, data sets and policies the command names,
    # as its rerun from a clean clone would; where it names none, every run on disk.
    only = Selection(
        seeds=frozenset(seeds) if args.seeds else None,
        datasets=frozenset(datasets) if args.datasets or args.dataset_file else None,
        policies=frozenset(policies) if args.policies else None,
    )
    # Without --report-only: a study commits its runs' summaries, and the full command skips
    # every run whose summary is there, so it regenerates the report from a clean clone (the
    # whole study's command, not one shard's).
    command = command_text(_study_argv(argv))
    preamble = (
        f"Protocol `{protocol.name}` as run: T = {rounds} rounds, seeds "
        f"{list(seeds)}; regenerate with `{command}`." + _learner_lines(protocol, datasets)
    )
    try:
        title = report_title(protocol.name, args.dataset_file)
        print(write_report(out, title, preamble, rounds, only))
    except FileNotFoundError as exc:  # --report-only where nothing has run
        parser.error(f"{exc} for T = {rounds}")
    except ValueError as exc:  # a corrupt summary, or full run files to convert first
        parser.error(str(exc))
    return 0


#: Options of how a study is run, not of what it is: left out of its regenerate command.
HOW_OPTIONS = ("--shard", "--merge", "--backend", "--address", "--retries")


def _study_argv(argv: list[str]) -> list[str]:
    """The command line without `--report-only` and the options of `HOW_OPTIONS` (each
    with its value, as `--shard 0/4` or `--shard=0/4`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in HOW_OPTIONS:
            skip = True
        elif arg != "--report-only" and not arg.startswith(tuple(f"{o}=" for o in HOW_OPTIONS)):
            kept.append(arg)
    return kept


def _check_plan_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--plan, --shard and --merge list, run or gather a study's runs: none goes with
    --http, --report-only or another of them (--plan lists a --shard's slices)."""
    given = [
        flag for flag in ("plan", "shard", "merge", "http", "report_only") if getattr(args, flag)
    ]
    allowed = {frozenset({"plan"}), frozenset({"shard"}), frozenset({"merge"})}
    allowed |= {frozenset({"plan", "shard"})}
    if frozenset(given) not in allowed:
        names = " and ".join(f"--{flag.replace('_', '-')}" for flag in given)
        parser.error(f"{names} do not go together")


def _merge(parser: argparse.ArgumentParser, args: argparse.Namespace, out: Path) -> None:
    """--merge: gather the shard folders' run files into `out`; the report follows as
    --report-only builds it. Nothing without --merge."""
    if not args.merge:
        return
    if args.out is None:
        parser.error("--merge needs --out, the folder the runs are gathered in")
    try:
        new = merge_runs(list(args.merge), out)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{new} run files gathered into {out / 'runs'}")
    args.report_only = True


def _learner_lines(protocol: Protocol, datasets: tuple[str, ...]) -> str:
    """What each data set with a learner is, and the learner its neural policies ran on."""
    from rofu.replay.simulation.datasets import load_bandit
    from rofu.replay.simulation.learners import get_learner

    named = [d for d in datasets or protocol.datasets if d in protocol.learners]
    lines = [
        f"- `{name}` ({load_bandit(name).notes}): learner `{learner.name}`, {learner.why}"
        for name in named
        for learner in [get_learner(protocol.learners[name])]
    ]
    return "\n\n" + "\n".join(lines) if lines else ""


def _preset_of(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    datasets: tuple[str, ...],
    protocol: Protocol,
) -> dict[str, str]:
    """The preset each data set's ROFU-family policies run (none where the protocol names
    a learner for it)."""
    spec: dict[str, str] = args.preset
    unknown = sorted(set(spec) - {"*", *datasets})
    if unknown and spec != TUNED_PRESETS:
        parser.error(f"--preset names data sets that do not run: {', '.join(unknown)}")
    presets = {d: spec.get(d, spec.get("*", PRODUCT.name)) for d in datasets}
    fixed = [d for d, name in presets.items() if d in protocol.learners and name != PRODUCT.name]
    if fixed and spec != TUNED_PRESETS:
        parser.error(
            f"--preset: {', '.join(fixed)} run the learner the {protocol.name} protocol names "
            "(rofu/replay/simulation/learners.py); a preset does not apply"
        )
    return {d: PRODUCT.name if d in protocol.learners else name for d, name in presets.items()}


def _finished(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    protocol: Protocol,
    names: tuple[tuple[str, ...], tuple[int, ...], int],
    out: Path,
) -> tuple[list[Job], set[Job]]:
    """Every job of the command (policies, seeds, rounds: from the names alone, no data is
    read), and those whose summary is under `out`, each summary read once (a corrupt one,
    or one another job made, is a usage error naming it)."""
    policies, seeds, rounds = names
    datasets = named_datasets(parser, args, () if args.dataset_file else protocol.datasets)
    presets = _preset_of(parser, args, datasets, protocol)
    jobs = jobs_for(datasets, policies, seeds, rounds, presets, protocol.learners)
    try:
        return jobs, {job for job in jobs if job.done(out)}
    except ValueError as exc:
        parser.error(str(exc))


def _all_done(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    protocol: Protocol,
    names: tuple[tuple[str, ...], tuple[int, ...], int],
    out: Path,
) -> bool:
    """Whether every job of the command has its summary under `out`."""
    jobs, finished = _finished(parser, args, protocol, names, out)
    return len(finished) == len(jobs)


def _combine(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    from rofu.replay.reports.combine import combine

    if args.out is None:
        parser.error("--combine needs --out, the folder of the combined report")
    if args.http or args.report_only or args.dataset_file:
        parser.error(
            "--combine runs nothing: it goes with neither --http, --report-only nor --dataset-file"
        )
    if args.out.resolve() in {folder.resolve() for folder in args.combine}:
        parser.error("--out must be a folder of its own, not one of those combined")
    command = command_text(argv)
    preamble = (
        "Combined from the reports in "
        + ", ".join(f"`{folder}`" for folder in args.combine)
        + " (a later folder's cell replaces an earlier one's, or merges with it when their "
        f"seeds are disjoint); regenerate with `{command}`. "
        "The regret curves are in those folders."
    )
    try:
        print(
            combine(
                list(args.combine),
                args.out,
                "Replay report: combined",
                preamble,
                policies=args.policies,
                datasets=args.datasets,
            )
        )
    except (FileNotFoundError, ValueError) as exc:
        parser.error(str(exc))
    return 0


def _compact(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from rofu.replay.compact import compact

    if args.out is None:
        parser.error("--compact needs --out, the study folder whose runs/ it converts")
    try:
        written = compact(args.out)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{len(written)} run files under {args.out / 'runs'} converted to summaries")
    return 0
