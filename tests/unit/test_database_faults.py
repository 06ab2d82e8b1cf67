"""Database failures on SQLite, in-process: a lock held, a full file, a read-only one, an
exhausted pool, a probe that hangs. Each is a bounded wait then a 503 with Retry-After
(never a 500), counted by cause and logged rate-limited; /readyz reflects whether writes
succeed. The cause labels and the rate-limited log are tested alone first."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg.errors as pg
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc

from rofu.service.db import faults, repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import DatabaseLimits
from rofu.service.runtime import Runtime
from rofu.service.settings import Settings
from tests.support import ROOT, app_client

CONTEXT = [0.1, 0.2, 0.3, 0.4]
UNLIMITED_PAGES = 1_073_741_823


def _sqlite_error(name: str, message: str = "boom") -> sa_exc.OperationalError:
    orig = sqlite3.OperationalError(message)
    orig.sqlite_errorname = name
    return sa_exc.OperationalError("INSERT ...", {}, orig)


def _postgres_error(kind: type[Exception], wrapper: type[sa_exc.DBAPIError]) -> Exception:
    return wrapper("SELECT ...", {}, kind("boom"))


# Cause labels and the rate-limited log -------------------------------------------------


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (sa_exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"), "pool_timeout"),
        (_sqlite_error("SQLITE_BUSY"), "lock_timeout"),
        (_sqlite_error("SQLITE_FULL"), "disk_full"),
        (_sqlite_error("SQLITE_READONLY_DBMOVED"), "read_only"),
        (_sqlite_error("SQLITE_IOERR_WRITE"), "io_error"),
        (_postgres_error(pg.LockNotAvailable, sa_exc.OperationalError), "lock_timeout"),
        (_postgres_error(pg.QueryCanceled, sa_exc.OperationalError), "statement_timeout"),
        (_postgres_error(pg.DiskFull, sa_exc.OperationalError), "disk_full"),
        (_postgres_error(pg.ReadOnlySqlTransaction, sa_exc.InternalError), "read_only"),
        (_postgres_error(pg.AdminShutdown, sa_exc.OperationalError), "connection"),
        (_postgres_error(pg.DeadlockDetected, sa_exc.OperationalError), "conflict"),
        (_postgres_error(pg.OperationalError, sa_exc.OperationalError), "connection"),
    ],
)
def test_faults_cause_of_names_each_failure_mode(error: Exception, cause: str) -> None:
    assert faults.is_outage(error)
    assert faults.cause_of(error) == cause
    assert cause in faults.CAUSES
    unavailable = faults.as_unavailable(error)
    assert (unavailable.status_code, unavailable.cause) == (503, cause)
    assert unavailable.headers() == {"Retry-After": "2"}


@pytest.mark.parametrize(
    "error",
    [
        _postgres_error(pg.UniqueViolation, sa_exc.IntegrityError),
        _postgres_error(pg.UndefinedTable, sa_exc.ProgrammingError),
        ValueError("not a database error"),
    ],
)
def test_faults_integrity_and_programming_errors_are_not_outages(error: Exception) -> None:
    assert not faults.is_outage(error)
    with pytest.raises(type(error)), repository.database_errors():
        raise error


def test_faults_rate_limited_log_reports_first_then_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = faults.RateLimitedLog(logging.getLogger("rofu.test"), 10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "rofu.test")
    written = []
    for step in range(25):  # one event per second for 25 s, of one cause
        written.append(log("disk_full", logging.WARNING, "database %s", "disk_full"))
        if step % 5 == 0:
            written.append(log("lock_timeout", logging.WARNING, "database %s", "lock_timeout"))
        now[0] += 1.0
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "database disk_full",
        "database lock_timeout",
        "database disk_full (9 more like it in the last 10s)",
        "database lock_timeout (1 more like it in the last 10s)",
        "database disk_full (9 more like it in the last 10s)",
        "database lock_timeout (1 more like it in the last 10s)",
    ]
    assert sum(written) == len(lines)


def test_settings_database_limits_have_bounded_defaults_and_are_validated() -> None:
    settings = Settings()
    assert DatabaseLimits.of(settings) == DatabaseLimits(5.0, 5, 5_000, 2_000, 5_000)
    assert settings.readyz_timeout_seconds == 2.0
    with pytest.raises(ValidationError, match="db_lock_timeout_ms"):
        Settings(db_lock_timeout_ms=10_000, db_statement_timeout_ms=5_000)
    for field in ("db_pool_timeout_seconds", "db_statement_timeout_ms", "sqlite_busy_timeout_ms"):
        with pytest.raises(ValidationError, match=field):
            Settings(**{field: 0})


# The service on a failing SQLite file --------------------------------------------------


def _runtime(app: FastAPI) -> Runtime:
    runtime: Runtime = app.state.runtime
    return runtime


class Pragmas:
    """PRAGMAs set on every connection the app's engine checks out (per transaction)."""

    def __init__(self, engine: Engine) -> None:
        self.values: dict[str, int] = {}
        event.listen(engine, "checkout", self._apply)

    def _apply(self, dbapi_connection: Any, *_: object) -> None:
        for name, value in self.values.items():
            dbapi_connection.execute(f"PRAGMA {name} = {value}")


def _database_errors(metrics_text: str) -> dict[str, float]:
    return {
        sample.labels["cause"]: sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "rofu_database_errors_total"
    }


def _unavailable(response: Any, cause: str) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"].isdigit()
    assert response.json()["error"]["code"] == "unavailable"
    assert cause in response.json()["error"]["message"]


@contextmanager
def _write_lock(database: Path) -> Iterator[None]:
    """Another connection holding SQLite's write lock."""
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.anyio
async def test_service_locked_sqlite_is_a_503_with_retry_after_then_recovers(
    sqlite_settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = sqlite_settings.model_copy(update={"sqlite_busy_timeout_ms": 100})
    async with app_client(settings) as (client, _):
        made = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "before"})
        assert made.status_code == 200
        with _write_lock(tmp_path / "rofu.sqlite"):
            chosen = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "e"})
            rewarded = await client.post("/v1/reward", json={"event_id": "before", "value": 1.0})
            ready = await client.get("/readyz")
        errors = _database_errors((await client.get("/metrics")).text)
        assert (await client.get("/readyz")).status_code == 200
        again = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "e"})
        stored = await client.post("/v1/reward", json={"event_id": "before", "value": 1.0})
    _unavailable(chosen, "lock_timeout")
    _unavailable(rewarded, "lock_timeout")
    assert ready.status_code == 503
    assert ready.json()["checks"] == {
        "database": "not writable",
        "database_cause": "lock_timeout",
        "database_detail": "OperationalError: database is locked",
        "model": "cold-start",
    }
    assert errors["lock_timeout"] >= 3  # the two requests and the probe
    assert "database lock_timeout on POST /v1/select" in caplog.text
    assert (again.status_code, stored.json()["duplicate"]) == (200, False)


@pytest.mark.anyio
async def test_service_exhausted_pool_is_a_503_not_a_500(sqlite_settings: Settings) -> None:
    settings = sqlite_settings.model_copy(update={"db_pool_timeout_seconds": 0.1})
    async with app_client(settings) as (client, app):
        made = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "held"})
        assert made.status_code == 200
        engine, held = _runtime(app).engine, []
        try:
            while len(held) < 100:  # every pooled connection checked out
                held.append(engine.connect())
        except sa_exc.TimeoutError:
            pass
        try:
            rewarded = await client.post("/v1/reward", json={"event_id": "held", "value": 1.0})
            chosen = await client.post("/v1/select", json={"context": CONTEXT})
        finally:
            for connection in held:
                connection.close()
        errors = _database_errors((await client.get("/metrics")).text)
        after = await client.post("/v1/reward", json={"event_id": "held", "value": 1.0})
    assert set(errors) == set(faults.CAUSES)  # exported from the start
    assert 0 < len(held) < 100
    _unavailable(rewarded, "pool_timeout")
    _unavailable(chosen, "pool_timeout")
    assert errors["pool_timeout"] >= 2
    assert after.status_code == 200


@pytest.mark.anyio
async def test_service_full_sqlite_is_a_503_and_not_ready_until_it_has_room(
    sqlite_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    async with app_client(sqlite_settings) as (client, app):
        pragmas = Pragmas(_runtime(app).engine)
        pragmas.values["max_page_count"] = 1  # capped at the current size: full
        ready = await client.get("/readyz")
        statuses = []
        for i in range(200):  # until the pages' free space is used up
            reply = await client.post("/v1/select", json={"context": CONTEXT, "event_id": f"f{i}"})
            statuses.append(reply.status_code)
            if reply.status_code == 503:
                _unavailable(reply, "disk_full")
                break
        errors = _database_errors((await client.get("/metrics")).text)
        pragmas.values["max_page_count"] = UNLIMITED_PAGES
        recovered = await client.get("/readyz")
        after = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "f-last"})
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "not writable"
    assert ready.json()["checks"]["database_cause"] == "disk_full"
    assert set(statuses[:-1]) <= {200}
    assert statuses[-1] == 503
    assert errors["disk_full"] >= 2  # the probe and the request
    assert "database disk_full on the readiness probe" in caplog.text
    assert (recovered.status_code, after.status_code) == (200, 200)


@pytest.mark.anyio
async def test_service_read_only_sqlite_is_not_ready_and_writes_are_503(
    sqlite_settings: Settings,
) -> None:
    async with app_client(sqlite_settings) as (client, app):
        made = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "ro"})
        pragmas = Pragmas(_runtime(app).engine)
        pragmas.values["query_only"] = 1
        ready = await client.get("/readyz")
        chosen = await client.post("/v1/select", json={"context": CONTEXT})
        rewarded = await client.post("/v1/reward", json={"event_id": "ro", "value": 0.5})
        replayed = await client.post("/v1/select", json={"context": CONTEXT, "event_id": "ro"})
        pragmas.values["query_only"] = 0
        recovered = await client.get("/readyz")
    assert made.status_code == 200
    assert (ready.status_code, ready.json()["checks"]["database"]) == (503, "not writable")
    assert ready.json()["checks"]["database_cause"] == "read_only"
    _unavailable(chosen, "read_only")
    _unavailable(rewarded, "read_only")
    assert replayed.json() == made.json()  # a stored decision still reads back
    assert recovered.status_code == 200


@pytest.mark.anyio
async def test_service_readyz_fails_once_writes_fail_past_the_bound_then_recovers_alone(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "rofu.runtime")
    settings = sqlite_settings.model_copy(update={"readyz_write_failure_seconds": 0.2})
    async with app_client(settings) as (client, app):
        # A probe blind to the failure, as its rolled-back write is to a WAL it cannot grow
        monkeypatch.setattr(faults, "probe", lambda _engine: faults.DatabaseStatus("ok"))
        pragmas = Pragmas(_runtime(app).engine)
        pragmas.values["query_only"] = 1
        refused = await client.post("/v1/select", json={"context": CONTEXT})
        await asyncio.sleep(0.3)
        failing = await client.get("/readyz")
        errors = _database_errors((await client.get("/metrics")).text)
        pragmas.values["query_only"] = 0
        recovered = await client.get("/readyz")  # nothing else wrote meanwhile
    _unavailable(refused, "read_only")
    assert failing.status_code == 503
    checks = failing.json()["checks"]
    assert (checks["database"], checks["database_cause"]) == ("not writable", "read_only")
    assert checks["database_detail"].startswith("writes failing for ")
    assert checks["database_detail"].endswith("attempt to write a readonly database")
    assert errors["read_only"] >= 2  # the request and the probe's commit
    assert recovered.status_code == 200
    assert "database takes reads and writes again" in caplog.text


@pytest.mark.anyio
async def test_service_raw_database_outage_is_a_503_and_a_database_bug_a_500(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    raised: list[Exception] = []

    def attach(*_: object) -> None:
        raise raised[-1]

    monkeypatch.setattr(reward_rows, "attach_rewards", attach)
    body = {"event_id": "any", "value": 1.0}
    async with app_client(sqlite_settings) as (client, _):
        raised.append(_postgres_error(pg.AdminShutdown, sa_exc.OperationalError))
        outage = await client.post("/v1/reward", json=body)
        raised.append(_postgres_error(pg.UndefinedTable, sa_exc.ProgrammingError))
        bug = await client.post("/v1/reward", json=body)
    _unavailable(outage, "connection")
    assert "database connection on POST /v1/reward: AdminShutdown: boom" in caplog.text
    assert bug.status_code == 500
    assert bug.json()["error"]["code"] == "internal_error"


@pytest.mark.anyio
async def test_service_readyz_answers_within_its_bound_while_the_probe_hangs(
    sqlite_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, calls = threading.Event(), []

    def hanging(engine: Engine) -> faults.DatabaseStatus:
        calls.append(engine)
        release.wait(30)
        return faults.DatabaseStatus("ok")

    settings = sqlite_settings.model_copy(update={"readyz_timeout_seconds": 0.2})
    async with app_client(settings) as (client, _):
        monkeypatch.setattr(faults, "probe", hanging)
        try:
            first = await client.get("/readyz")
            second = await client.get("/readyz")  # shares the probe still running
            probes_while_hanging = len(calls)
        finally:
            release.set()
        metrics_text = (await client.get("/metrics")).text
        recovered = await client.get("/readyz")
    for reply in (first, second):
        assert reply.status_code == 503
        assert reply.json()["checks"]["database"] == "timeout"
    assert probes_while_hanging == 1
    assert _database_errors(metrics_text)["timeout"] == 2
    assert recovered.status_code == 200


# SIGBUS --------------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from sqlalchemy import text
    from rofu.service.db import faults
    from rofu.service.db.engine import make_engine

    def insert(engine):
        with engine.begin() as connection:
            connection.execute(text("insert into t values (:x)"), {"x": b"x" * 5000})

    engine = make_engine(sys.argv[1])
    with engine.begin() as connection:  # the pooled connection maps the WAL index
        connection.execute(text("create table t (x)"))
    print("mapped", flush=True)
    sys.stdin.readline()  # the test makes the WAL index immutable meanwhile
    try:
        for _ in range(500):
            insert(engine)
    except Exception as exc:
        print("refused:", faults.cause_of(exc), flush=True)
    sys.stdin.readline()  # ... and writable again
    insert(engine)
    print("recovered", flush=True)
    """
)


def test_engine_refuses_an_unwritable_wal_index_instead_of_dying_of_sigbus(
    tmp_path: Path,
) -> None:
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr to make a file immutable")
    shm = tmp_path / "immutable.sqlite-shm"
    url = f"sqlite:///{tmp_path}/immutable.sqlite"
    command = [sys.executable, "-c", WRITER, url]
    options: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    with subprocess.Popen(command, cwd=ROOT, text=True, **options) as writer:
        assert writer.stdout is not None
        assert writer.stdin is not None

        def step() -> str:  # let the writer go on; its next line ("" once it died)
            with contextlib.suppress(BrokenPipeError):
                writer.stdin.write("go\n")
                writer.stdin.flush()
            return writer.stdout.readline().strip()

        lines = [writer.stdout.readline().strip()]
        immutable = subprocess.run([chattr, "+i", shm], check=False).returncode == 0
        try:
            lines.append(step())
        finally:
            if immutable:
                subprocess.run([chattr, "-i", shm], check=True)
        lines.append(step())
    if not immutable:
        pytest.skip("cannot make a file immutable here (needs CAP_LINUX_IMMUTABLE)")
    assert writer.returncode == 0, lines  # SIGBUS: -7
    assert lines == ["mapped", "refused: read_only", "recovered"]
