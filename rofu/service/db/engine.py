"""Engines for Postgres (production) and SQLite (embedded), with durable settings and
bounded waits."""

from __future__ import annotations

import functools
import os
import secrets
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, delete, event, insert, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from rofu.service.db.tables import DecisionRow, RewardRow

if TYPE_CHECKING:
    from rofu.service.settings import Settings

SessionFactory = sessionmaker[Session]
# A Postgres server that vanishes (a failover, a network black hole) never cancels a
# statement itself: TCP keepalives and a limit on unacknowledged data drop the connection
# after about 20 s of silence instead.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}


@dataclass(frozen=True)
class DatabaseLimits:
    """How long any one wait for the database may last (the `db_*` settings).

    A request waits at most `pool_timeout_s` for a pooled connection, then each statement
    at most `statement_timeout_ms` (Postgres; a lock at most `lock_timeout_ms`) or
    `sqlite_busy_timeout_ms` for SQLite's write lock. A new Postgres connection gives up
    after `connect_timeout_s`.
    """

    pool_timeout_s: float = 5.0
    connect_timeout_s: int = 5
    statement_timeout_ms: int = 5_000
    lock_timeout_ms: int = 2_000
    sqlite_busy_timeout_ms: int = 5_000

    @classmethod
    def of(cls, settings: Settings) -> DatabaseLimits:
        """The limits `settings` configure."""
        return cls(
            pool_timeout_s=settings.db_pool_timeout_seconds,
            connect_timeout_s=settings.db_connect_timeout_seconds,
            statement_timeout_ms=settings.db_statement_timeout_ms,
            lock_timeout_ms=settings.db_lock_timeout_ms,
            sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
        )


def normalise_url(url: str) -> str:
    """Use the psycopg 3 driver for plain postgresql:// URLs."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def make_engine(url: str, limits: DatabaseLimits | None = None, *, flush: bool = True) -> Engine:
    """An engine; SQLite gets WAL, full fsync, foreign keys and a busy timeout.

    With `limits` every wait is bounded by them; without (migrations, the trainer, the
    CLI) statements may run and wait for locks as long as they need. `flush=False` gives
    an engine whose commits return before they reach stable storage (SQLite
    `synchronous=NORMAL`, Postgres `synchronous_commit = off`): durable across a crash of
    this process, not across an operating-system crash or a power loss
    (`ROFU_DECISION_DURABILITY`).
    """
    url = normalise_url(url)
    if not url.startswith("sqlite"):
        engine = _postgres_engine(url, limits)
        if not flush:
            event.listen(engine, "connect", _postgres_unflushed_commits)
        return engine
    database = make_url(url).database
    file_backed = bool(database) and database != ":memory:"
    if file_backed:
        Path(str(database)).parent.mkdir(parents=True, exist_ok=True)
    busy_ms = 30_000 if limits is None else limits.sqlite_busy_timeout_ms
    options: dict[str, Any] = {} if limits is None else {"pool_timeout": limits.pool_timeout_s}
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": busy_ms / 1000}, **options
    )
    event.listen(engine, "connect", functools.partial(_sqlite_pragmas, busy_ms, flush))
    if file_backed:  # before a new connection's first statement, and before every one
        guard = functools.partial(_refuse_unwritable_shm, f"{database}-shm")
        event.listen(engine, "connect", guard, insert=True)
        event.listen(engine, "before_cursor_execute", guard)
    return engine


def in_memory(url: str) -> bool:
    """Whether `url` names an in-memory SQLite database (one per engine, never shared)."""
    url = normalise_url(url)
    return url.startswith("sqlite") and make_url(url).database in (None, "", ":memory:")


class MissingDatabase(ValueError):
    """No rofu database at the URL a read-only command was given (nothing was created)."""


#: A table every migrated rofu database has.
MARKER_TABLE = "decisions"


def existing_engine(url: str) -> Engine:
    """An engine on a rofu database that must already exist, for commands that only read
    (`rofu export`, `rofu evaluate`): a missing SQLite file, a database without rofu's
    tables or one that does not answer is a `MissingDatabase` naming the URL, and nothing
    is created, neither the file nor its folder.

    Raises:
        MissingDatabase: as above.
    """
    normalised = normalise_url(url)
    shown = make_url(url).render_as_string(hide_password=True)
    if normalised.startswith("sqlite"):
        database = make_url(normalised).database
        if not database or database == ":memory:":
            raise MissingDatabase(f"no rofu database at {shown}: an in-memory database is empty")
        path = Path(str(database))
        if not path.is_file():
            raise MissingDatabase(
                f"no rofu database at {shown}: {path.resolve()} does not exist "
                "(a relative path is read from the current folder)"
            )
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            present = inspect(connection).has_table(MARKER_TABLE)
    except DBAPIError as exc:
        engine.dispose()
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        raise MissingDatabase(f"no rofu database at {shown}: {reason}") from None
    if not present:
        engine.dispose()
        raise MissingDatabase(f"no rofu database at {shown}: it has no rofu tables (rofu migrate)")
    return engine


def _postgres_engine(url: str, limits: DatabaseLimits | None) -> Engine:
    pool: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 10}
    if limits is None:
        return create_engine(url, **pool)
    engine = create_engine(
        url,
        **pool,
        pool_timeout=limits.pool_timeout_s,
        connect_args={"connect_timeout": limits.connect_timeout_s, **KEEPALIVES},
    )
    event.listen(engine, "connect", functools.partial(_postgres_timeouts, limits))
    return engine


def _postgres_timeouts(limits: DatabaseLimits, dbapi_connection: Any, _record: object) -> None:
    # SET, not the `options` startup parameter, which connection poolers often refuse;
    # committed so that no later rollback of this first transaction undoes it.
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET statement_timeout = {int(limits.statement_timeout_ms)}")
        cursor.execute(f"SET lock_timeout = {int(limits.lock_timeout_ms)}")
    dbapi_connection.commit()


def _postgres_unflushed_commits(dbapi_connection: Any, _record: object) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    dbapi_connection.commit()


def _sqlite_pragmas(busy_ms: int, flush: bool, dbapi_connection: Any, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in (
        "journal_mode=WAL",
        # FULL: an acknowledged reward survives power loss; NORMAL: a process crash only
        "synchronous=FULL" if flush else "synchronous=NORMAL",
        "foreign_keys=ON",
        f"busy_timeout={int(busy_ms)}",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _refuse_unwritable_shm(shm: str, *_: object) -> None:
    # SQLite maps the WAL index (<db>-shm) into memory and writes to it in every read and
    # write transaction; once the file cannot be written (e.g. made immutable), such a
    # write kills the process with SIGBUS. Refuse the statement before SQLite sees it:
    # the request gets a 503. (Closing such a connection still writes to it.)
    if os.path.exists(shm) and not os.access(shm, os.W_OK):
        error = sqlite3.OperationalError(
            f"attempt to write a readonly database: {shm} (the WAL index) is not writable"
        )
        error.sqlite_errorname = "SQLITE_READONLY"
        raise error


def session_factory(engine: Engine) -> SessionFactory:
    """Sessions that keep loaded rows usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def ping(engine: Engine) -> None:
    """Raise if the database cannot answer a trivial query."""
    with engine.connect() as connection:
        connection.execute(text("select 1"))


def probe_write(engine: Engine, *, commit: bool = False) -> None:
    """Raise unless the tables the API writes take a write; nothing is kept.

    Inserts a decision and its reward and rolls them back; with `commit`, deletes them
    and commits instead: a real commit (SQLite appends to its WAL, Postgres flushes its
    WAL, only at commit) that leaves nothing behind for any reader. The decision spans
    several pages, so a database that cannot grow (a full disk, SQLite's max_page_count)
    fails like a real write; so do a lock held on either table, a read-only file or standby.
    """
    event_id = f"rofu-write-probe-{uuid.uuid4().hex}"
    decision = {
        "event_id": event_id,
        "context": [0.0] * 2048,  # about 10 kB of JSON: more than a page
        "candidates": [],
        "arm_id": "",
        "slot": 0,
        "propensity": 1.0,
        "model_version": 0,
        "explore": False,
        "policy": "write-probe",
        "scores": [],
        "request_hash": "",
    }
    reward_id = -1 - secrets.randbelow(2**31 - 1)  # an id: no sequence used
    with engine.connect() as connection:
        transaction = connection.begin()
        try:
            connection.execute(insert(DecisionRow).values(**decision))
            connection.execute(insert(RewardRow).values(id=reward_id, event_id=event_id, value=0.0))
            if commit:
                connection.execute(delete(RewardRow).where(RewardRow.id == reward_id))
                connection.execute(delete(DecisionRow).where(DecisionRow.event_id == event_id))
                transaction.commit()
        finally:
            if transaction.is_active:
                transaction.rollback()
