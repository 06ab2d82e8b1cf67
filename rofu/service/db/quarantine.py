"""Checkpoint quarantine: a checkpoint whose stored bytes are damaged is recorded as such
once, and nothing loads, serves or pins it again.

Quarantining a checkpoint that no valid checkpoint succeeds also releases the decisions it
consumed, so the next training run trains them from the newest valid checkpoint: they are
neither lost nor trained twice. Version numbers count quarantined checkpoints, so a
version is never reused.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import CheckpointRow, DecisionRow, utcnow

REASON_LENGTH = 1024  # the width of checkpoints.quarantine_reason


def quarantine(sessions: SessionFactory, version: int, reason: str) -> bool:
    """Quarantine checkpoint `version` and, when no valid checkpoint is newer, release the
    decisions it consumed. Returns False when it was quarantined already (or is absent).

    The row is updated first: on Postgres that locks it against a trainer committing a
    checkpoint on top of it (`repository.commit_checkpoint(parent=...)`), and on SQLite it
    takes the write lock before anything is read.
    """

    def work(session: Session) -> bool:
        marked = session.execute(
            update(CheckpointRow)
            .where(CheckpointRow.version == version, CheckpointRow.quarantined_at.is_(None))
            .values(quarantined_at=utcnow(), quarantine_reason=reason[:REASON_LENGTH])
        )
        if not cast(CursorResult[Any], marked).rowcount:
            return False
        newer = select(func.count()).where(
            CheckpointRow.version > version, CheckpointRow.quarantined_at.is_(None)
        )
        if not session.scalar(newer):
            session.execute(
                update(DecisionRow).where(DecisionRow.trained_in == version).values(trained_in=None)
            )
        return True

    with database_errors(), sessions() as session, session.begin():
        return work(session)


def newest_version(sessions: SessionFactory) -> int:
    """The highest version ever stored, quarantined or not (0: none)."""
    with database_errors(), sessions() as session, session.begin():
        return session.scalar(select(func.max(CheckpointRow.version))) or 0


def is_quarantined(sessions: SessionFactory, version: int) -> bool:
    """Whether checkpoint `version` is stored and quarantined."""
    query = select(CheckpointRow.quarantined_at).where(CheckpointRow.version == version)
    with database_errors(), sessions() as session, session.begin():
        return session.scalar(query) is not None
