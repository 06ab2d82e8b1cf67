"""`rofu export`: the decision log, with rewards, probabilities, model versions and per-arm
scores, as VW's DSJSON (`dsjson`), Open Bandit Pipeline arrays (`obp`, .npz) or Parquet.

Records stream from the database a page at a time (`rofu.service.log.pages`), so memory
stays constant; a file is written under a temporary name and renamed when complete.

Deferred decisions not activated in time: DSJSON and Parquet keep them, marked
(`_skipLearn`; the `active` column), OBP leaves them out, as training and evaluation do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rofu.service.db import arms as arm_rows
from rofu.service.db.engine import MissingDatabase, SessionFactory, existing_engine, session_factory
from rofu.service.errors import InvalidInput, ServiceError
from rofu.service.log.export.dsjson import write_dsjson
from rofu.service.log.export.obp import Catalogue, ObpExportError, write_obp
from rofu.service.log.export.parquet import MissingPyarrow, write_parquet
from rofu.service.log.pages import Window, iter_decisions, utc
from rofu.service.settings import Settings

FORMATS = ("dsjson", "obp", "parquet")


class ExportUsageError(ValueError):
    """The command line asks for something the export cannot do."""


def export(
    settings: Settings,
    fmt: str,
    window: Window,
    out: Path | None,
    *,
    default_reward: float | None = None,
) -> int:
    """Export the window's decisions in `fmt` to `out` (DSJSON: stdout when None).

    Returns:
        The number of decisions (OBP: rounds) written.

    Raises:
        ExportUsageError: an unknown format, or a binary format without `out`.
        MissingPyarrow: parquet without pyarrow.
        ObpExportError: the window's context length changes.
    """
    if fmt not in FORMATS:
        raise ExportUsageError(f"--format: choose one of {', '.join(FORMATS)}")
    if out is None and fmt != "dsjson":
        raise ExportUsageError(f"--format {fmt} writes a binary file: name it with --out")
    engine = existing_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        if out is None:
            return write_dsjson(iter_decisions(sessions, window), sys.stdout, _features(sessions))
        writer = _writer(fmt, sessions, window, default_reward)
        with _atomic(out) as partial:
            return writer(partial)
    finally:
        engine.dispose()


def _writer(
    fmt: str, sessions: SessionFactory, window: Window, default_reward: float | None
) -> Callable[[Path], int]:
    records = iter_decisions(sessions, window)
    if fmt == "parquet":
        return lambda path: write_parquet(records, path)
    if fmt == "obp":
        arms = [(row.id, row.slot, row.features) for row in arm_rows.list_arms(sessions)]
        catalogue = Catalogue.of(arms)
        return lambda path: write_obp(records, path, catalogue, default_reward=default_reward)

    def dsjson(path: Path) -> int:
        with open(path, "w", encoding="utf-8") as stream:
            return write_dsjson(records, stream, _features(sessions))

    return dsjson


def _features(sessions: SessionFactory) -> dict[str, list[float]]:
    return {row.id: row.features for row in arm_rows.list_arms(sessions) if row.features}


@contextlib.contextmanager
def _atomic(out: Path) -> Iterator[Path]:
    """A temporary path beside `out`, renamed to `out` if the block completes."""
    partial = out.with_name(out.name + ".partial")
    try:
        yield partial
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def run(settings: Settings, args: argparse.Namespace) -> int:
    """`rofu export` with parsed arguments: 0 done, 1 failed, 2 usage error."""
    default = settings.default_reward if args.default_reward is None else args.default_reward
    try:
        window = Window(
            None if args.since is None else utc(args.since, "since"),
            None if args.until is None else utc(args.until, "until"),
        )
        count = export(settings, args.format, window, args.out, default_reward=default)
    except (ExportUsageError, MissingPyarrow, InvalidInput, MissingDatabase) as exc:
        print(f"rofu export: {_message(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `rofu export --format dsjson | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ObpExportError, ServiceError, OSError) as exc:
        print(f"rofu export: {_message(exc)}", file=sys.stderr)
        return 1
    what = "rounds" if args.format == "obp" else "decisions"
    print(f"rofu export: {count} {what} -> {args.out or 'stdout'}", file=sys.stderr)
    return 0


def _message(exc: Exception) -> str:
    if not isinstance(exc, ServiceError):
        return str(exc)
    cause = exc.__cause__  # e.g. "no such table: decisions" (run `rofu migrate`)
    return exc.message if cause is None else f"{exc.message}: {str(cause).splitlines()[0]}"
