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
import json
import shlex
import sys
from pathlib import Path

from rofu.models.presets import PRESETS, PRODUCT
from rofu.replay.runner import PROTOCOLS, Protocol, jobs_for, run_jobs
from rofu.replay.simulation.datafile import (
    ClassificationFile,
    DataFileError,
    default_name,
    parse_delimiter,
)
from rofu.replay.simulation.datasets import DATASETS, check_datasets
from rofu.replay.simulation.policies import BUILT_IN, TUNED_PRESETS, canonical_policy_name

DEFAULT_OUT = Path("results") / "tmp"  # git-ignored: a default run overwrites no committed report


def parse_seeds(text: str) -> tuple[int, ...]:
    """`0-3` or `0,1,5` -> seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise argparse.ArgumentTypeError(f"seeds must look like 0-3 or 0,1,5, got {text!r}")
        seeds.extend(range(int(low), int(high or low) + 1))
    return tuple(seeds)


def parse_names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _command(argv: list[str]) -> str:
    return "rofu replay " + " ".join(shlex.quote(a) for a in argv)


def _folders(text: str) -> tuple[Path, ...]:
    return tuple(Path(name) for name in parse_names(text))


def _delimiter(text: str) -> str:
    try:
        return parse_delimiter(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _presets(text: str) -> dict[str, str]:
    """`NAME` (every data set; key "*"), `tuned` (TUNED_PRESETS) or `DATASET=NAME,...`."""
    if text == "tuned":
        return dict(TUNED_PRESETS)
    spec: dict[str, str] = {}
    for item in parse_names(text):
        dataset, _, name = item.rpartition("=")
        if name not in PRESETS:
            raise argparse.ArgumentTypeError(
                f"unknown preset {name!r}; known: {', '.join(PRESETS)} (or tuned)"
            )
        spec[dataset or "*"] = name
    return spec


def build_parser() -> argparse.ArgumentParser:
    """The options of `rofu replay`."""
    parser = argparse.ArgumentParser(prog="rofu replay", description=__doc__)
    parser.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        default="quick",
        help="quick: T=2000, 4 seeds; paper: T=20000, 16 seeds, paper data sets; ablation: "
        "the paper's section 5.1, ROFU at M = 1, 5, 10 against EpsilonGreedy and Greedy on "
        "the MLP and ResNet bandits, each on its paper learner",
    )
    parser.add_argument(
        "--datasets", type=parse_names, help="comma-separated (default: protocol's)"
    )
    parser.add_argument(
        "--policies",
        type=parse_names,
        help="comma-separated (default: the protocol's, or all built in)",
    )
    parser.add_argument("--seeds", type=parse_seeds, help="e.g. 0-3 (default: protocol's)")
    parser.add_argument("--rounds", type=int, help="T (default: protocol's)")
    parser.add_argument(
        "--preset",
        type=_presets,
        default={},
        metavar="NAME|tuned|DATASET=NAME,...",
        help="the ROFU preset (rofu/models/presets.py) that ROFU, ROFU-exact, ROFU-NTK, their "
        "variants and Greedy-matched run: one for every data set, `tuned` for each Showdown "
        "data set's tuned one (TUNED_PRESETS in rofu/replay/simulation/policies.py), or per "
        "data set, e.g. "
        "mushroom=small-lr,adult=sgd-decay (default: product, the one the service serves)",
    )
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    parser.add_argument(
        "--out", type=Path, help=f"results folder (default {DEFAULT_OUT}/<protocol>, git-ignored)"
    )
    parser.add_argument("--data-dir", type=Path, help="benchmark data (default ROFU_DATA_DIR)")
    files = parser.add_argument_group(
        "a data set of your own",
        "a classification file: one row per line, numeric features and a label column whose "
        "distinct values are the arms (reward 1 for the row's class); features z-scored; a "
        "header line is detected and skipped; .gz is read decompressed",
    )
    files.add_argument(
        "--dataset-file",
        type=Path,
        metavar="PATH",
        help="run this file (and the --datasets, if given, beside it)",
    )
    files.add_argument(
        "--label-column",
        type=int,
        metavar="N",
        help="0-based; negative counts from the end (default -1, the last)",
    )
    files.add_argument(
        "--delimiter",
        type=_delimiter,
        help="one character, tab or space (runs of blanks); default: the first of , ; tab | "
        "in the first line, else blanks",
    )
    files.add_argument(
        "--dataset-name",
        metavar="NAME",
        help="its name in run files and reports (default file:<file name without suffix>)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="cpu",
        help="where neural policies run (default cpu: one context per round leaves a GPU "
        "launch-bound, slower than a CPU core; auto: CUDA when present)",
    )
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report")
    parser.add_argument("--http", metavar="URL", help="play against a live service at URL")
    parser.add_argument(
        "--combine",
        type=_folders,
        metavar="DIR,DIR",
        help="run nothing: one report at --out from these reports (a later folder's cell "
        "wins, or adds its seeds where they are new)",
    )
    parser.add_argument(
        "--compact",
        action="store_true",
        help="run nothing: turn the full run files (.npz) under --out/runs into summaries, "
        "moving the files into --out/cache",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (e.g. when logging to a file)"
    )
    return parser


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
    if args.combine:
        return _combine(parser, args, argv)
    if args.compact:
        return _compact(parser, args)
    out = args.out or DEFAULT_OUT / args.protocol
    if args.http and args.report_only:
        parser.error("--report-only rebuilds a report from run files; it does not go with --http")
    try:  # matched without regard to case; run files and reports use the canonical name
        names = args.policies or protocol.policies or BUILT_IN
        policies = tuple(canonical_policy_name(name) for name in names)
    except ValueError as exc:
        parser.error(str(exc))
    # --report-only, or a study whose every run has its summary: no data needed
    done = args.report_only or (
        not args.http and _all_done(parser, args, protocol, policies, seeds, rounds, out)
    )
    datasets, file = _datasets(parser, args, protocol, files=not done)
    if args.http:
        return _http(parser, args.http, datasets, file, seeds, rounds, out, args.data_dir)
    if not args.report_only:
        presets = _preset_of(parser, args, datasets, protocol)
        run_jobs(
            jobs_for(datasets, policies, seeds, rounds, presets, protocol.learners),
            out,
            workers=args.workers,
            data_dir=args.data_dir,
            device=args.device,
            progress=not args.no_progress,
            files=() if file is None else (file,),
        )
    from rofu.replay.reports.report import write_report
    from rofu.replay.runs import Selection

    # The report holds only the runs of the seeds, data sets and policies the command names,
    # as its rerun from a clean clone would; where it names none, every run on disk.
    only = Selection(
        seeds=frozenset(seeds) if args.seeds else None,
        datasets=frozenset(datasets) if args.datasets or args.dataset_file else None,
        policies=frozenset(policies) if args.policies else None,
    )
    # Without --report-only: a study commits its runs' summaries, and the full command skips
    # every run whose summary is there, so it regenerates the report from a clean clone.
    command = _command([a for a in argv if a != "--report-only"])
    preamble = (
        f"Protocol `{protocol.name}` as run: T = {rounds} rounds, seeds "
        f"{list(seeds)}; regenerate with `{command}`." + _learner_lines(protocol, datasets)
    )
    try:
        print(write_report(out, f"Replay report: {protocol.name}", preamble, rounds, only))
    except FileNotFoundError as exc:  # --report-only where nothing has run
        parser.error(f"{exc} for T = {rounds}")
    except ValueError as exc:  # a corrupt summary, or full run files to convert first
        parser.error(str(exc))
    return 0


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


def _all_done(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    protocol: Protocol,
    policies: tuple[str, ...],
    seeds: tuple[int, ...],
    rounds: int,
    out: Path,
) -> bool:
    """Whether every job of the command has its summary under `out` (a corrupt one, or one
    another job made, is a usage error naming it)."""
    datasets = _named_datasets(parser, args, () if args.dataset_file else protocol.datasets)
    presets = _preset_of(parser, args, datasets, protocol)
    try:
        jobs = jobs_for(datasets, policies, seeds, rounds, presets, protocol.learners)
        return all(job.done(out) for job in jobs)
    except ValueError as exc:
        parser.error(str(exc))


def _datasets(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    protocol: Protocol,
    files: bool = True,
) -> tuple[tuple[str, ...], ClassificationFile | None]:
    """The data sets to run, checked before anything runs: registered names whose files are
    in the data folder, then the user's classification file, read in full (`files` False:
    the names only, where every run is done)."""
    if not files:  # --report-only names data sets to select, not to run
        default = () if args.dataset_file or args.report_only else protocol.datasets
        return _named_datasets(parser, args, default), None
    file = _dataset_file(parser, args)
    names = args.datasets or (() if file else protocol.datasets)
    try:
        names = check_datasets(names, args.data_dir)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return (names, None) if file is None else ((*names, file.name), file)


def _named_datasets(
    parser: argparse.ArgumentParser, args: argparse.Namespace, default: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The data sets a `--report-only` command names, else `default` (the registered ones
    checked by name only: the report reads run summaries, not data), the file's name last."""
    try:
        names = check_datasets(args.datasets or default, files=False)
    except ValueError as exc:
        parser.error(str(exc))
    if args.dataset_file is not None:
        names = (*names, args.dataset_name or default_name(args.dataset_file))
    return names


def _dataset_file(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> ClassificationFile | None:
    options = {
        "--label-column": args.label_column,
        "--delimiter": args.delimiter,
        "--dataset-name": args.dataset_name,
    }
    if args.dataset_file is None:
        given = [flag for flag, value in options.items() if value is not None]
        if given:
            parser.error(f"{', '.join(given)}: only with --dataset-file")
        return None
    name = args.dataset_name or default_name(args.dataset_file)
    if name.lower() in DATASETS:
        parser.error(f"--dataset-name {name!r} is a registered data set's name; pick another")
    label = -1 if args.label_column is None else args.label_column
    try:
        file = ClassificationFile(args.dataset_file, label, name, args.delimiter)
        file.load()  # read in full now: a bad file is a usage error, not a failed run
    except DataFileError as exc:
        parser.error(str(exc))
    return file


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
    command = _command(argv)
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


def _http(
    parser: argparse.ArgumentParser,
    url: str,
    datasets: tuple[str, ...],
    file: ClassificationFile | None,
    seeds: tuple[int, ...],
    rounds: int,
    out: Path,
    data_dir: Path | None,
) -> int:
    from rofu.client import RofuError
    from rofu.replay.runs import run_name
    from rofu.replay.simulation.datasets import load_bandit
    from rofu.replay.simulation.http_driver import play, serve_command

    figures = []
    for name in datasets:
        bandit = load_bandit(file if file is not None and name == file.name else name, data_dir)
        for seed in seeds:
            try:
                run = play(url, bandit, bandit.stream(rounds, seed), seed)
            except ValueError as exc:  # the service is not shaped for the bandit
                parser.error(f"{exc}; start a service for it with:\n  {serve_command(bandit)}")
            except RofuError as exc:
                parser.error(f"the service at {url} answered {exc}")
            run.result.save(out / "http" / name / run_name(seed, rounds).replace(".json", ".npz"))
            figures.append(
                {
                    "dataset": name,
                    "seed": seed,
                    "rounds": rounds,
                    "pseudo_regret": run.result.final_pseudo_regret,
                    "regret": run.result.final_regret,
                    **run.percentiles(),
                }
            )
            print(json.dumps(figures[-1]))
    (out / "http").mkdir(parents=True, exist_ok=True)
    (out / "http" / "results.json").write_text(json.dumps(figures, indent=2))
    return 0
