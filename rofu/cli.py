"""The `rofu` command: the service's commands, the replay harness and the benchmarks.

`service` owns serve, migrate, trainer, pin, unpin, promote, reject, export, import and
train and imports neither `replay` nor `benchmarks`; they are imported here only when
their command runs, so an image installed without the `replay` extra still serves, and
says what to install when asked to replay.
The service itself is imported lazily too: with only the client installed (`pip install
rofu`), its commands say to install the `server` extra instead of failing on an import.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib import import_module
from types import ModuleType

from pydantic import ValidationError

#: The service's commands (`rofu.service.cli`), which need the `server` extra.
SERVER_COMMANDS = (
    *("serve", "migrate", "trainer", "pin", "unpin", "promote", "reject"),
    *("export", "import", "train"),
)
#: What the service needs beyond the client (the `server` extra), as module names.
SERVER_EXTRA = (
    *("torch", "numpy", "safetensors", "pydantic_settings", "fastapi", "fastapi_offline"),
    *("starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "redis", "prometheus_client"),
)
#: What the harness needs beyond the service (the `replay` extra).
REPLAY_EXTRA = ("scipy", "matplotlib", "pandas", "tqdm")
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
    "bonus": ("rofu.bench.bonus", "the bonus's forms (ascent, closed, K-FAC) on one model"),
}


def _missing(exc: ModuleNotFoundError, extra: tuple[str, ...]) -> bool:
    """Whether `exc` is one of `extra`'s packages missing (else a real error)."""
    return exc.name is not None and exc.name.split(".")[0] in extra


def service_cli() -> ModuleType | None:
    """`rofu.service.cli`, or None when the `server` extra is not installed."""
    try:
        return import_module("rofu.service.cli")
    except ModuleNotFoundError as exc:
        if not _missing(exc, SERVER_EXTRA):
            raise
        return None


def build_parser(service: ModuleType | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command (the harness's own parsers take their arguments);
    without the service, its commands take any arguments and say what to install."""
    parser = argparse.ArgumentParser(prog="rofu", description="rofu recommendation service")
    commands = parser.add_subparsers(dest="command", required=True)
    service = service or service_cli()
    if service is None:
        for name in SERVER_COMMANDS:
            commands.add_parser(name, add_help=False, help="needs the server extra")
    else:
        service.add_commands(commands)
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
        if not _missing(exc, REPLAY_EXTRA + SERVER_EXTRA):
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


def configuration_errors(exc: ValidationError) -> list[str]:
    """One line per mistake in the settings: the setting, the value given, what is wrong."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = [str(part) for part in error["loc"]]
        if not loc:  # a check of several settings together: its message names them
            lines.append(f"rofu: configuration error: {message}")
            continue
        name = "ROFU_" + loc[0].upper() + "".join(f"[{part}]" for part in loc[1:])
        lines.append(f"rofu: configuration error: {name}={error['input']!r}: {message}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Dispatch `rofu <command> ...`; a mistake in the settings is one line per mistake and
    exit status 2 (`rofu --debug ...` shows the traceback instead)."""
    argv = sys.argv[1:] if argv is None else argv
    debug = bool(argv) and argv[0] == "--debug"
    try:
        return _dispatch(argv[1:] if debug else argv)
    except ValidationError as exc:
        if debug or exc.title != "Settings":
            raise
        for line in configuration_errors(exc):
            print(line, file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    service = service_cli()
    parser = build_parser(service)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(args.bench_parser, args.which, rest)
    if args.command in HARNESS:
        return _harness(*HARNESS[args.command])(rest)
    if service is None:
        print(
            f"rofu {args.command}: this command needs the server: pip install 'rofu[server]'",
            file=sys.stderr,
        )
        return 2
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    run: Callable[[argparse.Namespace], int] = service.run
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
