"""Database failures as the service reports them: a cause, a 503, a counted and
rate-limited log line, and the readiness probe.

A failure is an *outage* when retrying later can succeed: the database refuses, hangs,
times out, is full or is read-only. Each gets one cause (the `cause` label of
`rofu_database_errors_total`):

    connection         refused, lost or not answering; SQLite cannot open the file
    pool_timeout       every pooled connection stayed busy for db_pool_timeout_seconds
    statement_timeout  a query ran past db_statement_timeout_ms (Postgres)
    lock_timeout       a lock not granted within db_lock_timeout_ms (Postgres) or
                       sqlite_busy_timeout_ms (SQLite)
    conflict           a deadlock or serialization failure (Postgres)
    disk_full          no room to write (SQLite SQLITE_FULL, Postgres 53100)
    read_only          writes refused: a read-only file, a standby, an unwritable WAL index
    io_error           the disk failed a read or a write
    corrupt            the database file is damaged
    timeout            the readiness probe did not answer within readyz_timeout_seconds
    other              any other operational error

Integrity, data and programming errors are not outages: retrying cannot help, so they
stay what they are (a 409 handled by the caller, or a 500 that is a bug).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from rofu.service.db.engine import ping, probe_write
from rofu.service.errors import Unavailable

log = logging.getLogger("rofu.database")

CAUSES = (
    "connection",
    "pool_timeout",
    "statement_timeout",
    "lock_timeout",
    "conflict",
    "disk_full",
    "read_only",
    "io_error",
    "corrupt",
    "timeout",
    "other",
)
NOT_OUTAGES = (
    sa_exc.IntegrityError,
    sa_exc.DataError,
    sa_exc.ProgrammingError,
    sa_exc.NotSupportedError,
)
SQLITE_CAUSES = {  # primary result codes (sqlite3 errors carry `sqlite_errorname`)
    "SQLITE_BUSY": "lock_timeout",
    "SQLITE_LOCKED": "lock_timeout",
    "SQLITE_FULL": "disk_full",
    "SQLITE_READONLY": "read_only",
    "SQLITE_IOERR": "io_error",
    "SQLITE_CANTOPEN": "connection",
    "SQLITE_CORRUPT": "corrupt",
    "SQLITE_NOTADB": "corrupt",
}
POSTGRES_CAUSES = {  # SQLSTATE codes first, then their classes (psycopg's `sqlstate`)
    "57014": "statement_timeout",
    "55P03": "lock_timeout",
    "53100": "disk_full",
    "53300": "connection",
    "25006": "read_only",
    "58030": "io_error",
    "XX001": "corrupt",
    "57P01": "connection",
    "57P02": "connection",
    "57P03": "connection",
    "08": "connection",
    "40": "conflict",
}


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` is a database failure that a later retry can get past."""
    if isinstance(exc, sa_exc.TimeoutError):  # the pool's "QueuePool limit ... timed out"
        return True
    return isinstance(exc, sa_exc.DBAPIError) and not isinstance(exc, NOT_OUTAGES)


def cause_of(exc: BaseException) -> str:
    """The cause label of a database failure (see the module docstring)."""
    if isinstance(exc, sa_exc.TimeoutError):
        return "pool_timeout"
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str):
        return SQLITE_CAUSES.get("_".join(name.split("_")[:2]), "other")
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        return POSTGRES_CAUSES.get(state) or POSTGRES_CAUSES.get(state[:2], "other")
    invalidated = isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated
    if invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return "connection"  # psycopg: no SQLSTATE when the server cannot be reached
    return "other"


def describe(exc: BaseException | None) -> str:
    """One short line naming the driver's error, for the log."""
    if exc is None:
        return "no detail"
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0][:200] if lines else '(no message)'}"


def as_unavailable(exc: BaseException) -> Unavailable:
    """The 503 a database outage answers with (raise it `from exc`)."""
    cause = cause_of(exc)
    return Unavailable(f"database unavailable ({cause}); retry later", cause=cause)


class RateLimitedLog:
    """Logs the first event of each key at once, then at most one line per `interval_s`
    per key; a line says how many events of its key were held back since the last one.

    Args:
        logger: where the lines go.
        interval_s: the least time between two lines of one key.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, key: str, level: int, message: str, *args: object) -> bool:
        """Log `message % args` unless `key` was logged less than `interval_s` ago.

        Returns:
            Whether a line was written.
        """
        with self._lock:
            now = self._clock()
            last = self._last.get(key)
            if last is not None and now - last < self._interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            held = self._held.pop(key, 0)
            self._last[key] = now
        if held and last is not None:
            message += " (%d more like it in the last %.0fs)"
            args = (*args, held, now - last)
        self._logger.log(level, message, *args)
        return True


@dataclass(frozen=True)
class DatabaseStatus:
    """What the readiness probe found: `state` is ok, unreachable (reads fail), not
    writable (reads work, writes fail) or timeout; `cause` as in the module docstring."""

    state: str
    cause: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the database takes reads and writes."""
        return self.state == "ok"


def probe(engine: Engine) -> DatabaseStatus:
    """Read, then write in a rolled-back transaction (blocking; bounded by the engine's
    limits). Any failure is reported, never raised: readiness must answer."""
    try:
        ping(engine)
    except Exception as exc:
        return DatabaseStatus("unreachable", cause_of(exc), describe(exc))
    try:
        probe_write(engine)
    except Exception as exc:
        return DatabaseStatus("not writable", cause_of(exc), describe(exc))
    return DatabaseStatus("ok")


class DatabaseFaults:
    """The process's record of database failures: each is counted by cause and logged,
    rate-limited per cause.

    Args:
        count: called with the cause of every failure (e.g. a Prometheus counter's inc).
        log_interval_s: the least time between two log lines of one cause.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        count: Callable[[str], None],
        log_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._count = count
        self._log = RateLimitedLog(log, log_interval_s, clock)

    def record(self, cause: str, detail: str, where: str) -> None:
        """Count one failure and log it unless its cause was logged moments ago."""
        self._count(cause)
        self._log(cause, logging.WARNING, "database %s on %s: %s", cause, where, detail)

    def record_exception(self, exc: BaseException, where: str) -> bool:
        """Record `exc` if it is a database outage (raw, or already an `Unavailable`).

        Returns:
            Whether it was one (the caller logs anything else itself).
        """
        if isinstance(exc, Unavailable) and exc.cause is not None:
            self.record(exc.cause, describe(exc.__cause__), where)
            return True
        if is_outage(exc):
            self.record(cause_of(exc), describe(exc), where)
            return True
        return False
