"""Integration fixtures: the real Postgres, migrated once per session."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from rofu.service import migrate
from rofu.service.db.engine import DatabaseLimits, SessionFactory, make_engine, session_factory
from tests.support import require_postgres, reset_postgres

TABLES = ("model_pin", "rewards", "decisions", "arms", "checkpoints", "trainer_lease")


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A freshly migrated test database (once per session)."""
    url = require_postgres()
    reset_postgres(url)
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """One engine for the session."""
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_sessions(pg_engine: Engine, pg_clean: str) -> Iterator[sessionmaker[Session]]:
    """Sessions joined to an outer transaction that is rolled back after the test.

    Every `session.begin()` inside runs as a savepoint (SQLAlchemy's "joining a session
    into an external transaction"), so repository code commits as usual and the test
    still leaves nothing behind.
    """
    connection = pg_engine.connect()
    outer = connection.begin()
    yield sessionmaker(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    outer.rollback()
    connection.close()


@pytest.fixture
def pg_clean(pg_url: str) -> str:
    """Empty tables for tests whose app opens its own connections."""
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")
    return pg_url


@pytest.fixture
def two_engines(pg_clean: str) -> Iterator[tuple[SessionFactory, SessionFactory]]:
    """Two session factories on engines of their own (two replicas, or a replica and the
    trainer), bounded as the services' are: a lock wait gives up after 2 s and a deadlock
    is detected after 1 s, either failing a call."""
    engines = [make_engine(pg_clean, DatabaseLimits()) for _ in range(2)]
    yield session_factory(engines[0]), session_factory(engines[1])
    for engine in engines:
        engine.dispose()
