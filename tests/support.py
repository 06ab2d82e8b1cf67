"""Shared helpers for the service tests: real servers, app clients, service processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, event

from rofu.service.api.app import create_app
from rofu.service.settings import Settings

POSTGRES_URL = os.environ.get("ROFU_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("ROFU_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ROOT = Path(__file__).resolve().parents[1]


def unavailable(what: str, error: Exception) -> None:
    """Fail in CI (ROFU_REQUIRE_SERVICES=1), skip elsewhere: never skip silently in CI."""
    message = f"{what} is not reachable: {error}"
    if os.environ.get("ROFU_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " (ROFU_REQUIRE_SERVICES=1; start it with scripts/services.sh)")
    pytest.skip(message)


def require_module(name: str, installed_by: str) -> Any:
    """The imported module `name`; missing, it fails in CI and skips elsewhere (as
    `unavailable` does), saying what installs it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as error:
        message = f"{name} is not installed ({installed_by}): {error}"
        if os.environ.get("ROFU_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " (ROFU_REQUIRE_SERVICES=1)")
        pytest.skip(message)


def require_postgres() -> str:
    """The test database URL, after checking Postgres answers."""
    try:
        with psycopg.connect(
            POSTGRES_URL.replace("postgresql+psycopg", "postgresql"), connect_timeout=5
        ) as connection:
            connection.execute("select 1")
    except psycopg.Error as error:
        unavailable("Postgres", error)
    return POSTGRES_URL


def reset_postgres(url: str) -> None:
    """Drop every table (and Alembic's version table) of the test database."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("drop schema public cascade")
        connection.execute("create schema public")


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def app_client(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """An app started through its lifespan and an HTTP client talking to it in-process."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://rofu.test") as client:
            yield client, app


class Transactions:
    """The SQL statements of each committed or rolled-back transaction on an engine."""

    def __init__(self, engine: Engine) -> None:
        self.done: list[tuple[str, list[str]]] = []
        self._open: list[str] = []
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", lambda _: self._end("commit"))
        event.listen(engine, "rollback", lambda _: self._end("rollback"))

    def _statement(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        self._open.append(statement)

    def _end(self, how: str) -> None:
        self.done.append((how, self._open))
        self._open = []

    @property
    def commits(self) -> int:
        """Committed transactions."""
        return sum(how == "commit" for how, _ in self.done)

    def decision_writes(self) -> list[str]:
        """How each transaction that inserted decisions ended (commit or rollback)."""
        return [
            how
            for how, statements in self.done
            if any(s.lstrip().upper().startswith("INSERT INTO DECISIONS") for s in statements)
        ]


def wait_until_ready(base_url: str, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Poll /readyz until 200; raise with the process log if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not ready after {timeout}s")


@contextlib.contextmanager
def service_process(env: dict[str, str], log_path: Path, port: int | None = None) -> Iterator[str]:
    """Run `rofu serve` as a real process (uvicorn); yields its base URL."""
    port = port or free_port()
    full_env = {**os.environ, **env, "ROFU_HOST": "127.0.0.1", "ROFU_PORT": str(port)}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "rofu.service.cli", "serve", "--log-level", "warning"],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url, process)
        yield base_url
    except BaseException:
        print(log_path.read_text(errors="replace")[-5000:])
        raise
    finally:
        stop_process(process)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def seed_checkpoint(
    settings: Settings,
    n_rows: int = 300,
    version: int = 1,
    seed: int = 0,
    weight_scale: float = 1.0,
) -> None:
    """Migrate `settings.database_url` and store a trained-looking checkpoint in it.

    Lets a server start with a real model (ROFU scoring, not the cold start) without
    going through the trainer.
    """
    import torch

    from rofu.models import Checkpoint, RegulariserData, RewardNet, Transitions, dump_checkpoint
    from rofu.service import migrate
    from rofu.service.db.engine import make_engine, session_factory
    from rofu.service.lifecycle.checkpoint_store import CheckpointStore

    migrate.upgrade(settings.database_url)
    config = settings.net_config()
    gen = torch.Generator().manual_seed(seed)
    n_arms = config.n_arms or len(settings.arms)
    arms = torch.randint(len(settings.arms), (n_rows,), generator=gen)
    sample = Transitions(
        torch.randn(n_rows, settings.context_dim, generator=gen),
        arms,
        torch.randn(n_rows, generator=gen),
    )
    data = RegulariserData(sample, n_rows, torch.bincount(arms, minlength=n_arms))
    net = RewardNet(config)
    if weight_scale != 1.0:  # e.g. a network whose outputs overflow float32
        with torch.no_grad():
            for parameter in net.parameters():
                parameter.mul_(weight_scale)
    blob = dump_checkpoint(
        Checkpoint(version, config, net.state_dict(), data, extra={"created_at": str(time.time())})
    )
    engine = make_engine(settings.database_url)
    try:
        CheckpointStore(session_factory(engine), settings.checkpoint_dir).save(
            version, blob, metrics={}, rows_trained=n_rows, n_total=n_rows, consumed=[]
        )
    finally:
        engine.dispose()


def require_redis() -> str:
    """The test Redis URL, after checking Redis answers."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as error:
        unavailable("Redis", error)
    finally:
        client.close()
    return REDIS_URL


async def eventually(check, timeout: float = 15.0, interval: float = 0.05) -> None:
    """Await until `check()` is truthy; fail with its last value after `timeout`."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        await asyncio.sleep(interval)


@contextlib.contextmanager
def private_redis(
    port: int | None = None,
) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A redis-server of this test's own (so it can be stopped and restarted).

    Yields (url, stop, start).
    """
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server", FileNotFoundError("redis-server"))
    port = port or free_port()
    state: dict[str, subprocess.Popen[bytes] | None] = {"process": None}

    def start() -> None:
        state["process"] = subprocess.Popen(
            [
                str(binary),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return
            time.sleep(0.05)
        raise TimeoutError("private redis-server did not start")

    def stop() -> None:
        process = state["process"]
        if process is not None:
            stop_process(process)
            state["process"] = None

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", stop, start
    finally:
        stop()


def insert_bare_decision(connection: Any, event_id: str, context: str = "[0.0]") -> None:
    """Insert a cold-start decision with only the columns every revision since 0001 has
    (the migration round trips' fixture row)."""
    from sqlalchemy import text

    connection.execute(
        text(
            "insert into decisions (event_id, created_at, context, candidates, arm_id,"
            " slot, propensity, model_version, explore, policy, scores, request_hash)"
            " values (:event_id, '2026-01-01 00:00:00+00:00', :context, '[\"arm-0\"]',"
            " 'arm-0', 0, 1.0, 0, true, 'cold-start', '[]', 'h')"
        ),
        {"event_id": event_id, "context": context},
    )


def migration_0004_round_trip(url: str) -> None:
    """Upgrade a database at 0003 with a decision and a reward to head, then down to 0003
    and up again: the new columns come with their defaults, go, and come back; rows stay."""
    from sqlalchemy import inspect, text

    from rofu.service import migrate
    from rofu.service.db.engine import make_engine

    migrate.upgrade(url, "0003")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            insert_bare_decision(connection, "m-1")
            connection.execute(
                text(
                    "insert into rewards (event_id, value, received_at, repeats)"
                    " values ('m-1', 1.0, '2026-01-01 00:00:01+00:00', 0)"
                )
            )

        def columns(table: str) -> set[str]:
            return {column["name"] for column in inspect(engine).get_columns(table)}

        for step in ("head", "0003", "head"):
            (migrate.upgrade if step == "head" else migrate.downgrade)(url, step)
            engine.dispose()  # SQLite's rebuilt tables: read the schema afresh
            present = step == "head"
            assert ("probabilities" in columns("decisions")) is present
            assert ("late" in columns("rewards")) is present
            with engine.connect() as connection:
                assert connection.execute(text("select count(*) from rewards")).scalar() == 1
                if present:
                    query = (
                        "select probabilities, late from decisions join rewards using (event_id)"
                    )
                    row = connection.execute(text(query)).one()
                    assert row[0] is None
                    assert not row[1]
        index_names = {index["name"] for index in inspect(engine).get_indexes("decisions")}
        assert "ix_decisions_untrained" in index_names
    finally:
        engine.dispose()


def migration_0005_round_trip(url: str) -> None:
    """Upgrade a database at 0004 with a decision to head, then down to 0004 and up again:
    the activation columns come with their defaults (not deferred, never activated), go,
    and come back; the decision stays, and stays trainable."""
    from sqlalchemy import inspect, text

    from rofu.service import migrate
    from rofu.service.db.engine import make_engine

    migrate.upgrade(url, "0004")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            insert_bare_decision(connection, "m-5")
        added = {"deferred", "activated_at", "activation_late"}
        for step in ("head", "0004", "head"):
            (migrate.upgrade if step == "head" else migrate.downgrade)(url, step)
            engine.dispose()
            columns = {column["name"] for column in inspect(engine).get_columns("decisions")}
            assert added & columns == (added if step == "head" else set())
            with engine.connect() as connection:
                assert connection.execute(text("select count(*) from decisions")).scalar() == 1
                if step == "head":
                    query = "select deferred, activated_at, activation_late from decisions"
                    deferred, activated_at, late = connection.execute(text(query)).one()
                    assert (bool(deferred), activated_at, bool(late)) == (False, None, False)
    finally:
        engine.dispose()


def migration_0007_round_trip(url: str) -> None:
    """Upgrade a database at 0004 with a decision to head, down to 0004 and up again: the
    named-features columns come NULL, go and come back; the decision stays."""
    from sqlalchemy import inspect, text

    from rofu.service import migrate
    from rofu.service.db.engine import make_engine

    migrate.upgrade(url, "0004")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            insert_bare_decision(connection, "m-7", context="[0.5]")
        for step in ("head", "0004", "head"):
            (migrate.upgrade if step == "head" else migrate.downgrade)(url, step)
            engine.dispose()
            names = {column["name"] for column in inspect(engine).get_columns("decisions")}
            present = step == "head"
            assert ("named_context" in names, "arm_features" in names) == (present, present)
            with engine.connect() as connection:
                columns = "context, named_context, arm_features" if present else "context"
                row = connection.execute(text(f"select {columns} from decisions")).one()
                assert "0.5" in str(row[0])
                assert all(value is None for value in row[1:])
    finally:
        engine.dispose()


def migration_0008_round_trip(url: str) -> None:
    """Upgrade a database at 0007 with a rewarded decision to 0008, down to 0007 and up
    again: the holdout's columns and the rewards' metrics come NULL, go and come back; the
    decision and its reward stay."""
    from sqlalchemy import inspect, text

    from rofu.service import migrate
    from rofu.service.db.engine import make_engine

    migrate.upgrade(url, "0007")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            insert_bare_decision(connection, "m-8", context="[0.5]")
            connection.execute(
                text(
                    "insert into rewards (event_id, value, received_at, "
                    "repeats, late) values ('m-8', 1.5, '2026-12-02', 0, false)"
                )
            )
        for step in ("0008", "0007", "0008"):
            (migrate.upgrade if step == "0008" else migrate.downgrade)(url, step)
            engine.dispose()
            present = step == "0008"
            decisions = {column["name"] for column in inspect(engine).get_columns("decisions")}
            rewards = {column["name"] for column in inspect(engine).get_columns("rewards")}
            assert (
                {"experiment", "unit_id"} <= decisions
                if present
                else not {"experiment", "unit_id"} & decisions
            )
            assert ("metrics" in rewards) == present
            with engine.connect() as connection:
                row = connection.execute(text("select value from rewards")).one()
                assert row[0] == 1.5
                if present:
                    extra = "select experiment, unit_id from decisions"
                    assert tuple(connection.execute(text(extra)).one()) == (None, None)
    finally:
        engine.dispose()


def migration_0009_round_trip(url: str) -> None:
    """Upgrade a database at 0008 with a checkpoint to head, down to 0008 and up again:
    the stored checkpoint comes out promoted (it was served), with no gate figures."""
    from sqlalchemy import inspect, text

    from rofu.service import migrate
    from rofu.service.db.engine import make_engine

    migrate.upgrade(url, "0008")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "insert into checkpoints (version, created_at, checksum, size_bytes, "
                    "metrics, rows_trained, n_total) values (1, :now, 'c', 0, '{}', 0, 0)"
                ),
                {"now": datetime.now(UTC)},
            )
        for step in ("head", "0008", "head"):
            (migrate.upgrade if step == "head" else migrate.downgrade)(url, step)
            engine.dispose()
            names = {column["name"] for column in inspect(engine).get_columns("checkpoints")}
            present = step == "head"
            assert ("gate_status" in names, "gate" in names) == (present, present)
            if present:
                with engine.connect() as connection:
                    row = connection.execute(text("select gate_status, gate from checkpoints"))
                    assert tuple(row.one()) == ("promoted", None)
    finally:
        engine.dispose()


def together(*work: Callable[[], Any]) -> list[Any]:
    """Run each function in its own thread, released at once (a barrier); their results, or
    the exceptions they raised, in order."""
    start, results = threading.Barrier(len(work)), [None] * len(work)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work[i]()
        except Exception as exc:  # the caller reports it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results
