"""Whether the process's writes reach the database, seen through the engine's events.

Every path that writes (a decision, a reward, an arm, the readiness probe, the embedded
trainer) goes through one engine, so its events see each outcome, whoever wrote:

    a write failed     an INSERT, UPDATE or DELETE, or the COMMIT of a transaction that
                       wrote, raised a database outage (`rofu.service.db.faults`)
    a write succeeded  the COMMIT of a transaction that wrote returned

A rolled-back write proves nothing about commits (SQLite writes its WAL, Postgres waits
for its WAL flush, only at commit), so it can fail a streak but never end one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection, ExceptionContext

from rofu.service.db.faults import DatabaseStatus, cause_of, describe, is_outage

log = logging.getLogger("rofu.database")

WRITE_STATEMENT = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)
# Keys in a connection's `info`, which lives as long as its DBAPI connection.
WROTE = "rofu.wrote"  # the open transaction wrote
COMMITTING = "rofu.committing"  # a COMMIT of a transaction that wrote was sent


@dataclass(frozen=True)
class WriteFailure:
    """The failing streak: since when (monotonic seconds), and its latest failure."""

    since: float
    cause: str
    detail: str


class WriteHealth:
    """The process's record of write outcomes: failing since when, or not failing.

    Args:
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failure: WriteFailure | None = None
        self._announced = False  # the streak's 503 was logged

    @property
    def failure(self) -> WriteFailure | None:
        """The failing streak, or None while writes succeed."""
        return self._failure

    def failed(self, cause: str, detail: str) -> None:
        """A write failed: start the streak, or make this its latest failure."""
        with self._lock:
            since = self._clock() if self._failure is None else self._failure.since
            self._failure = WriteFailure(since, cause, detail)

    def succeeded(self) -> None:
        """A write committed: the streak, if any, ends."""
        with self._lock:
            self._failure, self._announced = None, False

    def status(self, bound_s: float) -> DatabaseStatus:
        """`not writable` once the streak lasted over `bound_s` seconds, else `ok`."""
        with self._lock:
            failure = self._failure
            seconds = 0.0 if failure is None else self._clock() - failure.since
            if failure is None or seconds <= bound_s:
                return DatabaseStatus("ok")
            announce, self._announced = not self._announced, True
        detail = f"writes failing for {seconds:.1f} s: {failure.detail}"
        if announce:
            log.warning("database %s; /readyz answers 503 until a write commits", detail)
        return DatabaseStatus("not writable", failure.cause, detail)

    def watch(self, engine: Engine) -> None:
        """Record the outcome of every write made through `engine`."""
        event.listen(engine, "before_cursor_execute", _note_write)
        event.listen(engine, "commit", _note_commit)
        event.listen(engine, "handle_error", self._on_error)
        for name in ("begin", "rollback"):  # a connection's next step after a COMMIT
            event.listen(engine, name, self.settle_connection)
        event.listen(engine, "checkin", lambda _dbapi, record: self._settle(record.info))

    def settle_connection(self, connection: Connection) -> None:
        """`begin` and `rollback`: settle the connection's last COMMIT. A connection the
        database dropped mid-transaction has no `info` left to read (reading it raises
        PendingRollbackError, which a rollback listener must not turn into a 500)."""
        self._settle(_info(connection))

    def _settle(self, info: MutableMapping[Any, Any] | None) -> None:
        """A COMMIT that raised nothing has succeeded by the connection's next step."""
        if info is None:
            return
        info.pop(WROTE, None)
        if info.pop(COMMITTING, False):
            self.succeeded()

    def _on_error(self, context: ExceptionContext) -> None:
        info = _info(context.connection)
        committing = info is not None and info.pop(COMMITTING, False)
        statement = context.statement or ""
        error = context.sqlalchemy_exception or context.original_exception
        if (committing or WRITE_STATEMENT.match(statement)) and is_outage(error):
            self.failed(cause_of(error), describe(error))


def _note_write(connection: Connection, _cursor: object, statement: str, *_: object) -> None:
    if WRITE_STATEMENT.match(statement):
        connection.info[WROTE] = True


def _note_commit(connection: Connection) -> None:
    if connection.info.pop(WROTE, False):
        connection.info[COMMITTING] = True


def _info(connection: Connection | None) -> MutableMapping[Any, Any] | None:
    """A failing connection's `info`, unless it is already gone."""
    if connection is None or connection.invalidated or connection.closed:
        return None
    return connection.info
