"""`rofu replay`'s command line: its parser, and the data sets its arguments name, checked
before anything runs (registered names whose files are in the data folder, then a
classification file of the user's, read in full)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from rofu.models.presets import PRESETS
from rofu.replay.plan import Shard
from rofu.replay.runner import PROTOCOLS, Protocol
from rofu.replay.simulation.datafile import (
    ClassificationFile,
    DataFileError,
    default_name,
    parse_delimiter,
)
from rofu.replay.simulation.datasets import DATASETS, check_datasets
from rofu.replay.simulation.http_plan import ALLOW_FLAG, DEFAULT_WAIT_S, SYNC_MODES
from rofu.replay.simulation.policies import TUNED_PRESETS

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


def command_text(argv: list[str]) -> str:
    return "rofu replay " + " ".join(shlex.quote(a) for a in argv)


def folders(text: str) -> tuple[Path, ...]:
    return tuple(Path(name) for name in parse_names(text))


def delimiter_text(text: str) -> str:
    try:
        return parse_delimiter(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def preset_map(text: str) -> dict[str, str]:
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
        type=preset_map,
        default={},
        metavar="NAME|tuned|DATASET=NAME,...",
        help="the ROFU preset (rofu/models/presets.py) that ROFU, ROFU-exact, ROFU-NTK, their "
        "variants and the matched policies (Greedy-, SquareCB-, NeuralLinUCB-matched) run: "
        "one for every data set, `tuned` for each Showdown data set's tuned one "
        "(TUNED_PRESETS in rofu/replay/simulation/policies.py), or per data set, e.g. "
        "mushroom=small-lr,adult=sgd-decay (default: product, the one the service serves)",
    )
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    parser.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where runs execute: local (--workers processes, the default) or ray (one Ray "
        "task per run; the replay-ray extra)",
    )
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="with --backend ray: the cluster's address (default: a new local Ray instance)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        help="with --backend ray: how often a failed run is retried (default 2)",
    )
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
        type=delimiter_text,
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
    parser.add_argument(
        "--plan",
        action="store_true",
        help="run nothing: list the study's runs, each done or pending, and count them "
        "(with --shard I/N, each run's shard of N)",
    )
    parser.add_argument(
        "--merge",
        type=folders,
        metavar="DIR,DIR",
        help="copy the run files of these shard folders into --out (refusing two different "
        "runs under one name), then build the report there as --report-only does",
    )
    parser.add_argument(
        "--shard",
        type=Shard.parse,
        metavar="I/N",
        help="run only the I-th (0-based) of N disjoint slices of the study, balanced by "
        "expected cost, into the shared --out; the report is built once every slice is done",
    )
    _live_service(parser)
    parser.add_argument(
        "--combine",
        type=folders,
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


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _live_service(parser: argparse.ArgumentParser) -> None:
    live = parser.add_argument_group(
        "against a live service",
        "--http plays the streams with real /select and /reward calls. Before each run it "
        "reads the service's settings (GET /v1/model) and says on stderr, a line each, what "
        "they imply: when a model can come, and the waits for it",
    )
    live.add_argument(
        "--http",
        metavar="URL",
        help="play against a live service at URL (with API keys: a client key in ROFU_API_KEY)",
    )
    live.add_argument(
        "--http-sync",
        choices=SYNC_MODES,
        help="when the run waits for the service to learn: every (the default): after the "
        "warm-start rounds, then every ROFU_TRAIN_EVERY_REWARDS rounds, for a model that "
        "learned from every round played; first: once, after the warm-start rounds; none: "
        f"never (refused on a service that serves no model, unless {ALLOW_FLAG})",
    )
    live.add_argument(
        "--http-wait",
        type=seconds,
        metavar="SECONDS",
        help=f"the longest wait for one model (default {DEFAULT_WAIT_S:g}); a wait that ends "
        "with no model at all stops the run",
    )
    live.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="run where the service's settings leave only cold-start (uniform) decisions, "
        "and play on where no model came in time",
    )


def http_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the --http-* options go with --http, and fill in their defaults."""
    given = [
        flag
        for flag, value in (
            ("--http-sync", args.http_sync),
            ("--http-wait", args.http_wait),
            (ALLOW_FLAG, args.http_allow_cold_start or None),
        )
        if value is not None
    ]
    if given and not args.http:
        parser.error(f"{', '.join(given)}: only with --http")
    args.http_sync = args.http_sync or "every"
    args.http_wait = DEFAULT_WAIT_S if args.http_wait is None else args.http_wait


def checked_datasets(
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
        return named_datasets(parser, args, default), None
    file = dataset_file(parser, args)
    names = args.datasets or (() if file else protocol.datasets)
    try:
        names = check_datasets(names, args.data_dir)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return (names, None) if file is None else ((*names, file.name), file)


def named_datasets(
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


def dataset_file(
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
