"""The `rofu` command: the service's commands, the replay harness and the benchmarks.

`service` owns serve, migrate, trainer, pin, unpin and export and imports neither `replay` nor
`benchmarks`; they are imported here only when their command runs, so an image installed
without the `replay` extra still serves, and says what to install when asked to replay.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib import import_module

from rofu.service import cli as service_cli

#: What the harness needs beyond the service (the `replay` extra).
REPLAY_EXTRA = ("scipy", "matplotlib", "pandas", "tqdm", "httpx")
#: command -> (module, function taking the remaining arguments)
HARNESS = {
    "replay": ("rofu.replay.cli", "main"),
    "ope": ("rofu.replay.ope_cli", "ope_main"),
    "evaluate": ("rofu.evaluation.evaluate", "main"),
}
BENCHMARKS = {
    "kernel": ("rofu.bench.kernel", "the ROFU scoring kernel, side by side"),
    "load": ("rofu.bench.load", "the served API under concurrent clients"),
    "stability": ("rofu.bench.stability", "ROFU's ascent stability along a replay run"),
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command (the harness's own parsers take their arguments)."""
    parser = argparse.ArgumentParser(prog="rofu", description="rofu recommendation service")
    commands = parser.add_subparsers(dest="command", required=True)
    service_cli.add_commands(commands)
    commands.add_parser(
        "replay", add_help=False, help="replay harness: benchmark bandits, regret reports"
    )
    commands.add_parser(
        "ope", add_help=False, help="off-policy evaluation on the Open Bandit Dataset sample"
    )
    commands.add_parser(
        "evaluate",
        add_help=False,
        help="off-policy estimates of the served model and alternatives on the service's log",
    )
    bench = commands.add_parser(
        "bench",
        add_help=False,  # `rofu bench <which> --help` reaches the benchmark's own parser
        help="benchmarks that time contenders side by side and print ratios",
        description="; ".join(f"{name}: {what}" for name, (_, what) in BENCHMARKS.items()),
    )
    bench.add_argument("which", nargs="?", choices=tuple(BENCHMARKS), help="which benchmark")
    bench.set_defaults(bench_parser=bench)
    return parser


def _harness(module: str, function: str) -> Callable[[list[str]], int]:
    """The harness's entry point, or a usage error naming the extra it needs."""
    try:
        entry: Callable[[list[str]], int] = getattr(import_module(module), function)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in REPLAY_EXTRA:
            raise
        print(
            f"rofu: this command needs the `replay` extra ({exc.name} is not installed): "
            "pip install 'rofu[replay]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return entry


def _bench(parser: argparse.ArgumentParser, which: str | None, rest: list[str]) -> int:
    if which is None:
        if rest and rest[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        parser.error(f"choose a benchmark: {', '.join(BENCHMARKS)}")
    return _harness(BENCHMARKS[which][0], "main")(rest)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `rofu <command> ...`."""
    parser = build_parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command == "bench":
        return _bench(args.bench_parser, args.which, rest)
    if args.command in HARNESS:
        return _harness(*HARNESS[args.command])(rest)
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    return service_cli.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
