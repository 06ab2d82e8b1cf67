"""The trainer lock: exactly one trainer trains at a time, enforced by the database.

Postgres: a session-level advisory lock, taken on a connection of its own for the length
of a run; the server releases it when that connection ends, so a killed trainer never
leaves it behind. SQLite has no advisory locks: the single row of `trainer_lease` names
the holder until an expiry. A lease whose holder ran on this host and is gone (its process
ended) is taken over at once; another host's lease only once it expired.

The lock keeps trainers from working in vain; what keeps a row from being trained twice
is the claim at commit (`repository.commit_checkpoint`), which holds without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol, cast

from sqlalchemy import CursorResult, or_, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from rofu.service.db.engine import SessionFactory
from rofu.service.db.repository import database_errors
from rofu.service.db.tables import TrainerLeaseRow, utcnow
from rofu.service.errors import Unavailable

log = logging.getLogger("rofu.trainer")
# One 64-bit key for every rofu trainer on a database (advisory locks are per database).
ADVISORY_KEY = int.from_bytes(hashlib.sha256(b"rofu.trainer").digest()[:8], "big", signed=True)
LEASE_SECONDS = 600.0  # longer than a run; a longer run lets a second trainer start in vain
_PROCESS = uuid.uuid4().hex[:12]  # tells this process from an earlier one with the same pid


class TrainerLock(Protocol):
    """Held for the length of one training run."""

    def hold(self) -> contextlib.AbstractContextManager[bool]:
        """Try to take the lock without waiting; yields whether it was taken."""
        ...


def trainer_lock(sessions: SessionFactory) -> TrainerLock:
    """The lock that suits the database of `sessions`."""
    with sessions() as session:
        dialect = session.get_bind().dialect.name
    return AdvisoryLock(sessions) if dialect == "postgresql" else LeaseLock(sessions)


class AdvisoryLock:
    """Postgres: `pg_try_advisory_lock` on a connection kept for the run (autocommit, so
    no transaction stays open while the model fits)."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    @contextlib.contextmanager
    def hold(self) -> Iterator[bool]:
        """Take the lock for the block, if no other trainer holds it."""
        with self._sessions() as session:
            with database_errors():
                connection = session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
                taken = bool(
                    connection.scalar(
                        text("select pg_try_advisory_lock(:key)"), {"key": ADVISORY_KEY}
                    )
                )
            try:
                yield taken
            finally:
                if taken:
                    try:
                        connection.execute(
                            text("select pg_advisory_unlock(:key)"), {"key": ADVISORY_KEY}
                        )
                    except DBAPIError:  # closing the connection releases the lock
                        connection.invalidate()


class LeaseLock:
    """SQLite: the `trainer_lease` row, taken in a write transaction."""

    def __init__(self, sessions: SessionFactory, seconds: float = LEASE_SECONDS) -> None:
        self._sessions = sessions
        self._seconds = seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{_PROCESS}:{uuid.uuid4().hex[:8]}"

    @contextlib.contextmanager
    def hold(self) -> Iterator[bool]:
        """Take the lease for the block, if no live trainer holds it."""
        taken = self._transaction(self._take)
        try:
            yield taken
        finally:
            if taken:
                try:
                    self._transaction(self._release)
                except Unavailable as exc:  # it expires, or this trainer takes it again
                    log.warning("trainer lease not released (%s)", exc)

    def _transaction(self, work: Callable[[Session], bool]) -> bool:
        try:
            with database_errors(), self._sessions() as session, session.begin():
                return work(session)
        except IntegrityError:  # another trainer created the row at the same moment
            return False

    def _take(self, session: Session) -> bool:
        now = utcnow()
        expires = now + timedelta(seconds=self._seconds)
        free = or_(
            TrainerLeaseRow.holder.is_(None),
            TrainerLeaseRow.holder == self.holder,
            TrainerLeaseRow.expires_at < now,
        )
        claim = update(TrainerLeaseRow).where(TrainerLeaseRow.id == 1, free)  # write first
        result = session.execute(claim.values(holder=self.holder, expires_at=expires))
        if cast(CursorResult[Any], result).rowcount:
            return True
        row = session.get(TrainerLeaseRow, 1)
        if row is None:
            session.add(TrainerLeaseRow(id=1, holder=self.holder, expires_at=expires))
            session.flush()
            return True
        if row.holder is None or not _gone(row.holder):
            return False
        log.warning("taking over the trainer lease of %s, which is no longer running", row.holder)
        row.holder, row.expires_at = self.holder, expires
        return True

    def _release(self, session: Session) -> bool:
        release = update(TrainerLeaseRow).where(
            TrainerLeaseRow.id == 1, TrainerLeaseRow.holder == self.holder
        )
        session.execute(release.values(holder=None, expires_at=utcnow()))
        return True


def _gone(holder: str) -> bool:
    """Whether a lease holder ran on this host and its process has ended."""
    host, _, rest = holder.partition(":")
    pid_text, _, rest = rest.partition(":")
    process = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another host's process: only its lease's expiry tells
    pid = int(pid_text)
    if pid == os.getpid():
        return process != _PROCESS  # an earlier process that had this pid (a restart)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
