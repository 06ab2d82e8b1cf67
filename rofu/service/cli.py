"""The service's commands: serve, migrate, trainer, pin, unpin, promote, reject, export,
import and train.

`rofu.cli` dispatches them (and the harness's replay, ope, evaluate and bench, which this
package never imports); `python -m rofu.service.cli` runs them alone, in an image installed
without the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rofu.service.settings import Settings, get_settings

if TYPE_CHECKING:
    from rofu.service.db.engine import SessionFactory
    from rofu.service.lifecycle.redis_bus import RedisBus


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = get_settings()
    _logging(args.log_level)
    if args.workers < 1:
        print("rofu serve: --workers must be >= 1", file=sys.stderr)
        return 2
    if args.workers > 1 and settings.in_process_trainer:
        print(
            "rofu serve: --workers > 1 would run one in-process trainer per worker; set "
            "ROFU_EMBEDDED_TRAINER=false and run one `rofu trainer` (or use ROFU_REDIS_URL)",
            file=sys.stderr,
        )
        return 2
    if args.workers > 1 and settings.mode == "embedded" and settings.is_sqlite:
        from rofu.service import migrate

        migrate.upgrade(settings.database_url)  # once here, not raced by every worker
    uvicorn.run(
        "rofu.service.api.app:create_app",
        factory=True,
        host=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=_uvicorn_logging(args.log_level),
        access_log=args.access_log,
    )
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from rofu.service import migrate

    url = get_settings().database_url
    if args.downgrade:
        migrate.downgrade(url, args.downgrade)
    else:
        migrate.upgrade(url, args.revision)
    print(f"database at {migrate.current_revision_of(url)}")
    return 0


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _logging(level: str) -> None:
    # A fatal signal (e.g. SIGBUS from an unwritable SQLite WAL index) leaves a traceback
    # in the log instead of a silent exit; worker processes inherit the variable.
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    with contextlib.suppress(AttributeError, OSError, ValueError):  # stderr without an fd
        faulthandler.enable()
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _uvicorn_logging(level: str) -> dict[str, Any]:
    """uvicorn's logging config plus ours, applied in every worker process too."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["rofu"] = {"format": LOG_FORMAT}
    config["handlers"]["rofu"] = {
        "class": "logging.StreamHandler",
        "formatter": "rofu",
        "stream": "ext://sys.stderr",
    }
    config["root"] = {"handlers": ["rofu"], "level": level.upper()}
    config["loggers"]["alembic"] = {"level": "WARNING"}
    return config


def _trainer(args: argparse.Namespace) -> int:
    from rofu.service.lifecycle.trainer_process import run_trainer

    _logging(args.log_level)
    return run_trainer(get_settings(), once=args.once)


@contextlib.contextmanager
def _operator(command: str) -> Iterator[tuple[Settings, SessionFactory, RedisBus | None]]:
    """The settings, database and bus an operator command works on, closed afterwards; a
    `ServiceError` it raises is its one-line message and exit status 1 (`OperatorError`)."""
    from rofu.service.db.engine import make_engine, session_factory
    from rofu.service.errors import ServiceError
    from rofu.service.lifecycle.redis_bus import RedisBus

    settings = get_settings()
    engine = make_engine(settings.database_url)
    bus = None if settings.redis_url is None else RedisBus.of(settings)
    try:
        yield settings, session_factory(engine), bus
    except ServiceError as exc:
        raise OperatorError(f"rofu {command}: {exc.message}") from exc
    finally:
        engine.dispose()
        if bus is not None:
            bus.close()


class OperatorError(Exception):
    """An operator command refused: its one line for stderr."""


def _pin(args: argparse.Namespace) -> int:
    from rofu.service.db import repository
    from rofu.service.lifecycle import pinning
    from rofu.service.lifecycle.checkpoint_store import CheckpointStore

    try:
        with _operator(args.command) as (settings, sessions, bus):
            if args.command == "unpin":
                pinning.unpin(sessions, bus)
            elif args.version is not None:
                store = CheckpointStore(sessions, settings.checkpoint_dir)
                pinning.pin(
                    sessions,
                    store,
                    settings.served_net_configs(),
                    args.version,
                    bus,
                    hash_seed=settings.feature_hash_seed,
                )
            pinned = repository.get_pin(sessions)
    except OperatorError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"pinned: {pinned}" if pinned is not None else "not pinned: the newest checkpoint is served"
    )
    return 0


def _decide(args: argparse.Namespace) -> int:
    """`rofu promote` / `rofu reject`: the evaluation gate's decision by hand."""
    from rofu.service.db import repository
    from rofu.service.lifecycle import gate_admin

    status = "promoted" if args.command == "promote" else "rejected"
    try:
        with _operator(args.command) as (_, sessions, bus):
            row = gate_admin.decide(sessions, args.version, status, args.reason, bus)
            newest = repository.latest_checkpoint(sessions, with_blob=False)
            pinned = repository.get_pin(sessions)
    except OperatorError as exc:
        print(exc, file=sys.stderr)
        return 1
    served = pinned if pinned is not None else (None if newest is None else newest.version)
    print(f"checkpoint {row.version}: {row.gate_status}; served: {served or 'none'}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from rofu.service.log import export

    return export.run(get_settings(), args)


def _import(args: argparse.Namespace) -> int:
    from rofu.service.log import imports

    return imports.run(get_settings(), args)


def _train(args: argparse.Namespace) -> int:
    from rofu.service.lifecycle import from_log

    _logging(args.log_level)
    return from_log.run(get_settings(), args)


def _share(text: str) -> float:
    """A fraction in [0, 1) from the command line."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction in [0, 1), e.g. 0.2")
    return value


def moment(text: str) -> datetime:
    """An ISO 8601 date or time from the command line; without an offset it is UTC."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 date or time (e.g. 2026-11-25 or 2026-11-25T12:00Z)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


SERVICE_COMMANDS = (
    *("serve", "migrate", "trainer", "pin", "unpin", "promote", "reject"),
    *("export", "import", "train"),
)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def add_commands(commands: Any) -> None:
    """Add the service's sub-commands to an `add_subparsers()` object."""
    serve = commands.add_parser("serve", help="run the HTTP service (settings from ROFU_*)")
    serve.add_argument("--host", help="bind address (default: ROFU_HOST)")
    serve.add_argument("--port", type=int, help="port (default: ROFU_PORT)")
    serve.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="log threshold (default info)"
    )
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="uvicorn worker processes, each with its own micro-batcher (default 1); more "
        "than 1 needs the trainer out of process (ROFU_EMBEDDED_TRAINER=false)",
    )
    migrate = commands.add_parser("migrate", help="migrate the database (ROFU_DATABASE_URL)")
    migrate.add_argument("--revision", default="head", help="upgrade to this revision")
    migrate.add_argument("--downgrade", metavar="REVISION", help="downgrade to this revision")
    trainer = commands.add_parser("trainer", help="run the trainer worker (production)")
    trainer.add_argument("--once", action="store_true", help="one training run, then exit")
    trainer.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="log threshold (default info)"
    )
    pin = commands.add_parser("pin", help="roll back: serve a stored checkpoint version")
    pin.add_argument("version", type=int, nargs="?", help="version to serve (omit: show the pin)")
    commands.add_parser("unpin", help="serve the newest checkpoint again")
    for name, what in (("promote", "servable: served if newest"), ("reject", "never served")):
        gate = commands.add_parser(name, help=f"the evaluation gate by hand: {what}")
        gate.add_argument("version", type=int, help="the stored checkpoint's version")
        gate.add_argument("--reason", help="why (stored with the decision)")
    _add_export(commands)
    _add_import(commands)


def _add_import(commands: Any) -> None:
    imported = commands.add_parser(
        "import",
        help="read decision logs (VW DSJSON: rofu export's, Personalizer's) into the database",
    )
    imported.add_argument(
        "--dsjson",
        type=Path,
        nargs="+",
        required=True,
        metavar="FILE",
        help="DSJSON files, one event a line; each is imported whole or not at all",
    )
    train = commands.add_parser(
        "train", help="store checkpoints trained on the stored (e.g. imported) log"
    )
    train.add_argument(
        "--from-log",
        action="store_true",
        help="train on every decision not yet consumed, without waiting for reward windows",
    )
    train.add_argument(
        "--holdout",
        type=_share,
        default=0.0,
        metavar="FRACTION",
        help="leave the newest FRACTION of the rewarded decisions unconsumed, for "
        "`rofu evaluate` (default 0)",
    )
    train.add_argument(
        "--log-level", default="warning", choices=LOG_LEVELS, help="log threshold (default warning)"
    )


def _add_export(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="write the decision log with rewards: VW DSJSON, OBP arrays (.npz) or Parquet",
    )
    export.add_argument(
        "--format",
        required=True,
        choices=("dsjson", "obp", "parquet"),
        help="dsjson: Vowpal Wabbit's decision-service JSON lines; obp: Open Bandit "
        "Pipeline's bandit feedback (.npz); parquet: one row per decision (the export extra)",
    )
    export.add_argument("--since", type=moment, help="decisions made at this time or later")
    export.add_argument("--until", type=moment, help="decisions made before this time")
    export.add_argument(
        "--out", type=Path, help="the file to write (dsjson without it: standard output)"
    )
    export.add_argument(
        "--default-reward",
        type=float,
        help="obp: the reward of decisions that got none (default ROFU_DEFAULT_REWARD; "
        "unset: they are left out)",
    )


def run(args: argparse.Namespace) -> int:
    """Run a parsed service command."""
    handlers = {
        "serve": _serve,
        "migrate": _migrate,
        "trainer": _trainer,
        "pin": _pin,
        "unpin": _pin,
        "promote": _decide,
        "reject": _decide,
        "export": _export,
        "import": _import,
        "train": _train,
    }
    return handlers[args.command](args)


def main(argv: list[str] | None = None) -> int:
    """`python -m rofu.service.cli <command> ...`: the service's commands only."""
    parser = argparse.ArgumentParser(prog="rofu", description="rofu recommendation service")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
