"""The record of write outcomes (`rofu.service.db.write_health`) on a real SQLite engine:
which outcomes start a failing streak, which end it, and when it makes /readyz fail."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc

from rofu.service import migrate
from rofu.service.db.engine import make_engine, probe_write
from rofu.service.db.write_health import WriteHealth

INSERT = text("insert into t (id) values (:id)")
READ_ONLY = "OperationalError: attempt to write a readonly database"


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path}/db/w.sqlite"
    (tmp_path / "db").mkdir()
    migrate.upgrade(url)  # the probe writes the service's tables
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("create table t (id integer primary key)"))
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(engine: Engine, clock: Clock) -> WriteHealth:
    health = WriteHealth(clock)
    health.watch(engine)
    return health


def fail_a_write(engine: Engine, row: int = 1) -> None:
    """An INSERT refused by a read-only connection (SQLITE_READONLY)."""
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA query_only = 1")
        try:
            with pytest.raises(sa_exc.OperationalError, match="readonly"):
                connection.execute(INSERT, {"id": row})
            connection.rollback()
        finally:
            connection.exec_driver_sql("PRAGMA query_only = 0")


def test_write_health_a_failed_write_starts_a_streak_that_only_a_commit_ends(
    engine: Engine, health: WriteHealth, clock: Clock
) -> None:
    with engine.connect() as connection:  # reads say nothing about writes
        connection.execute(text("select count(*) from t"))
    assert health.failure is None

    fail_a_write(engine)
    started = health.failure
    clock.now += 3
    fail_a_write(engine)
    assert started is not None
    assert (started.since, started.cause, started.detail) == (100.0, "read_only", READ_ONLY)
    assert health.failure is not None
    assert health.failure.since == 100.0  # the streak's start, not its latest failure

    with engine.connect() as connection:  # a write rolled back proves nothing
        connection.execute(INSERT, {"id": 1})
        connection.rollback()
        connection.execute(text("select count(*) from t"))
    assert health.failure is not None

    with engine.begin() as connection:
        connection.execute(INSERT, {"id": 2})
    assert health.failure is None


def test_write_health_status_fails_only_past_the_bound(
    engine: Engine, health: WriteHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    assert health.status(5.0).ok
    fail_a_write(engine)
    clock.now += 5
    within = health.status(5.0)
    clock.now += 7
    past = [health.status(5.0), health.status(5.0)]
    probe_write(engine)  # rolled back: the streak goes on
    kept = health.status(5.0)
    probe_write(engine, commit=True)  # the readiness probe's commit, of nothing
    after = health.status(5.0)
    with engine.connect() as connection:
        left = connection.execute(text("select count(*) from decisions")).scalar()

    assert within.ok
    assert [(s.state, s.cause) for s in past] == [("not writable", "read_only")] * 2
    assert past[0].detail == f"writes failing for 12.0 s: {READ_ONLY}"
    warnings = [r for r in caplog.records if "/readyz answers 503" in r.getMessage()]
    assert len(warnings) == 1  # once per streak
    assert not kept.ok
    assert after.ok
    assert left == 0


def test_write_health_ignores_errors_that_are_not_outages(
    engine: Engine, health: WriteHealth
) -> None:
    with engine.begin() as connection:
        connection.execute(INSERT, {"id": 1})
    with pytest.raises(sa_exc.IntegrityError), engine.begin() as connection:
        connection.execute(INSERT, {"id": 1})  # a repeated key: retrying cannot help
    assert health.failure is None


@contextlib.contextmanager
def immutable(paths: list[Path]) -> Iterator[None]:
    """`paths` immutable for the block (skips where `chattr +i` is refused)."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr to make a file immutable")
    done = subprocess.run([chattr, "+i", *map(str, paths)], capture_output=True, check=False)
    try:
        if done.returncode != 0:
            pytest.skip(f"cannot make files immutable here: {done.stderr.decode().strip()}")
        yield
    finally:
        subprocess.run([chattr, "-i", *map(str, paths)], capture_output=True, check=False)


def test_write_health_counts_a_commit_that_fails(
    engine: Engine, health: WriteHealth, tmp_path: Path
) -> None:
    database = tmp_path / "db" / "w.sqlite"
    wal = database.with_name("w.sqlite-wal")
    with immutable([database, wal, database.parent]):
        with engine.connect() as connection:  # the statement works: only COMMIT writes
            connection.execute(INSERT, {"id": 1})
            with pytest.raises(sa_exc.OperationalError, match="disk I/O error"):
                connection.commit()
        failure = health.failure
        probe_write(engine)  # rolled back: blind to a WAL that cannot be written
        with pytest.raises(sa_exc.OperationalError, match="disk I/O error"):
            probe_write(engine, commit=True)
    probe_write(engine, commit=True)

    assert failure is not None
    assert (failure.cause, failure.detail) == ("io_error", "OperationalError: disk I/O error")
    assert health.failure is None


def test_write_health_a_connection_lost_mid_transaction_rolls_back_without_raising(
    engine: Engine, health: WriteHealth
) -> None:
    # The database dropped the connection during a write (as a Postgres stopped mid-insert
    # does): the rollback's listener must not read the dead connection's info, which
    # raised PendingRollbackError and turned the request's 503 into a 500.
    with engine.connect() as connection:
        connection.begin()
        connection.execute(INSERT, {"id": 7})
        connection.invalidate()
        connection.rollback()
    assert health.failure is None
    with engine.begin() as connection:  # the pool gives a fresh connection
        connection.execute(INSERT, {"id": 8})
