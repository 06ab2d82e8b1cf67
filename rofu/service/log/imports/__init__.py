"""`rofu import --dsjson FILE...`: decision logs in VW's DSJSON (rofu's export, Personalizer's
log mirror) into the service's `decisions` and `rewards` tables (`ROFU_DATABASE_URL`).

Each file is read twice. The first pass checks every line (`rofu.service.log.imports.
dsjson` parses it, `rows.vectors` hashes its features as `/v1/select` would) and looks
for event ids repeated in the file or already stored, arms the catalogue lacks and room
for them; the second, only when the first found no problem, writes the file's new arms
(each with the features of its first appearance), decisions and rewards in one
transaction. A file with a problem imports nothing, and every problem is reported with
its line; the other files are imported on their own. Memory holds the file's event ids,
not its events.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rofu.service import migrate
from rofu.service.db import arms as arm_rows
from rofu.service.db.engine import MissingDatabase, SessionFactory, session_factory
from rofu.service.db.repository import find_decisions, transaction
from rofu.service.db.tables import ArmRow
from rofu.service.errors import ServiceError
from rofu.service.log.imports.dsjson import DsjsonError, Event, parse_line
from rofu.service.log.imports.rows import Vectors, decision_rows, vectors
from rofu.service.settings import Settings

MAX_LISTED = 20  # problems listed per file; the rest are counted
CHUNK = 500


@dataclass
class FileReport:
    """What importing one file did, or the problems that kept it from importing anything."""

    path: Path
    events: int = 0
    rewarded: int = 0
    arms_created: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line, what is wrong)

    def lines(self) -> list[str]:
        """The report's lines: one when imported, else the problems (at most MAX_LISTED)."""
        if not self.problems:
            return [
                f"{self.path}: imported {self.events} events ({self.rewarded} with rewards), "
                f"{self.arms_created} arms created"
            ]
        listed = [
            f"{self.path}:{line}: {reason}" if line else f"{self.path}: {reason}"
            for line, reason in sorted(self.problems)[:MAX_LISTED]
        ]
        more = len(self.problems) - MAX_LISTED
        return [
            *listed,
            *([f"{self.path}: ... and {more} more problems"] if more > 0 else []),
            f"{self.path}: {len(self.problems)} problems; nothing imported from this file",
        ]


@dataclass
class _Plan:
    """What the first pass found: the file's events by line, and the arms to create."""

    lines: dict[str, int] = field(default_factory=dict)  # event id -> line
    new_arms: dict[str, list[float] | None] = field(default_factory=dict)
    rewarded: int = 0


def _events(
    path: Path, settings: Settings, report: FileReport
) -> Iterator[tuple[int, str, Event, Vectors]]:
    """(line number, line, event, its vectors) of every line that parses; the others'
    problems go to `report`. Blank lines are skipped."""
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                event = parse_line(line)
                yield number, line, event, vectors(event, settings)
            except DsjsonError as exc:
                report.problems.append((number, str(exc)))


def _check(path: Path, settings: Settings, sessions: SessionFactory, report: FileReport) -> _Plan:
    """The first pass: every line checked, and the file against the database."""
    plan = _Plan()
    known = {row.id for row in arm_rows.list_arms(sessions)}
    for number, _, event, found in _events(path, settings, report):
        first = plan.lines.setdefault(event.event_id, number)
        if first != number:
            report.problems.append((number, f"EventId {event.event_id!r} repeats line {first}"))
            continue
        plan.rewarded += event.reward is not None
        for action in event.actions:
            if action.arm in known or action.arm in plan.new_arms:
                continue
            own = found.arm_features.get(action.arm)
            if settings.arm_feature_dim and own is None:
                report.problems.append(
                    (
                        number,
                        f"arm {action.arm!r} is new and has no features here; "
                        f"ROFU_ARM_FEATURE_DIM={settings.arm_feature_dim} needs them",
                    )
                )
            plan.new_arms[action.arm] = own
    ids = list(plan.lines)
    for start in range(0, len(ids), CHUNK):
        for event_id in find_decisions(sessions, ids[start : start + CHUNK]):
            report.problems.append(
                (plan.lines[event_id], f"EventId {event_id!r} is already in the database")
            )
    if len(known) + len(plan.new_arms) > settings.max_arms:
        report.problems.append(
            (
                0,
                f"{len(plan.new_arms)} new arms would make {len(known) + len(plan.new_arms)}, "
                f"over ROFU_MAX_ARMS={settings.max_arms}",
            )
        )
    return plan


def import_file(settings: Settings, sessions: SessionFactory, path: Path) -> FileReport:
    """Import one DSJSON file whole, or nothing of it (see the module docstring)."""
    report = FileReport(path)
    plan = _check(path, settings, sessions, report)
    if report.problems:
        return report

    def work(session: Session) -> None:
        highest = session.scalar(select(func.max(ArmRow.slot)))
        slot = 0 if highest is None else highest + 1
        for offset, (arm, features) in enumerate(plan.new_arms.items()):
            session.add(ArmRow(id=arm, slot=slot + offset, features=features, active=True))
        session.flush()
        slots = {row.id: row.slot for row in session.scalars(select(ArmRow))}
        for count, (_, line, event, found) in enumerate(_events(path, settings, report), 1):
            decision, reward = decision_rows(event, found, slots, line)
            session.add(decision)
            if reward is not None:
                session.add(reward)
            if count % CHUNK == 0:
                session.flush()
        if report.problems:  # the file changed between the passes
            raise DsjsonError("the file changed while it was imported")

    try:
        transaction(sessions, work)
    except (IntegrityError, DsjsonError) as exc:  # e.g. a service stored an id meanwhile
        report.problems.append((0, f"nothing imported: {str(exc).splitlines()[0]}"))
        return report
    report.events, report.rewarded = len(plan.lines), plan.rewarded
    report.arms_created = len(plan.new_arms)
    return report


def import_files(settings: Settings, paths: list[Path]) -> list[FileReport]:
    """Import each file in turn (each whole or not at all).

    Raises:
        MissingDatabase: no migrated rofu database at `ROFU_DATABASE_URL`.
    """
    engine = migrate.migrated_engine(settings.database_url)
    try:
        sessions = session_factory(engine)
        return [import_file(settings, sessions, path) for path in paths]
    finally:
        engine.dispose()


def run(settings: Settings, args: argparse.Namespace) -> int:
    """`rofu import` with parsed arguments: 0 all imported, 1 a file was not, 2 usage error."""
    missing = [path for path in args.dsjson if not path.is_file()]
    if missing:
        print(f"rofu import: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    try:
        reports = import_files(settings, args.dsjson)
    except MissingDatabase as exc:
        print(f"rofu import: {exc}", file=sys.stderr)
        return 2
    except (ServiceError, OSError, UnicodeDecodeError) as exc:
        print(f"rofu import: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        for line in report.lines():
            print(f"rofu import: {line}", file=sys.stdout if not report.problems else sys.stderr)
    return 1 if any(report.problems for report in reports) else 0
