"""Every revision upgrades and downgrades for real on Postgres."""

from __future__ import annotations

import psycopg
from sqlalchemy import inspect

from rofu.service import migrate
from rofu.service.db.engine import make_engine
from tests.integration.conftest import TABLES
from tests.support import (
    migration_0004_round_trip,
    migration_0005_round_trip,
    migration_0007_round_trip,
    migration_0008_round_trip,
    migration_0009_round_trip,
)


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_upgrade_downgrade_upgrade_on_postgres(pg_url):
    assert set(TABLES) <= _tables(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()

    migrate.downgrade(pg_url, "base")
    assert _tables(pg_url) & set(TABLES) == set()
    assert migrate.current_revision_of(pg_url) is None

    migrate.upgrade(pg_url)
    assert set(TABLES) <= _tables(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()


def test_migrations_each_revision_steps_down_and_up(pg_url):
    head = migrate.head_revision()
    migrate.downgrade(pg_url, "-1")
    assert migrate.current_revision_of(pg_url) != head
    migrate.upgrade(pg_url, "+1")
    assert migrate.current_revision_of(pg_url) == head


def test_migrations_0004_adds_and_drops_probabilities_and_late_on_postgres(pg_url):
    migration_0004_round_trip(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")


def test_migrations_0005_adds_and_drops_the_activation_columns_on_postgres(pg_url):
    migration_0005_round_trip(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")


def test_migrations_0007_adds_and_drops_the_named_feature_columns_on_postgres(pg_url):
    migration_0007_round_trip(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")


def test_migrations_0008_adds_and_drops_the_holdout_columns_on_postgres(pg_url):
    migration_0008_round_trip(pg_url)
    migrate.upgrade(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")


def test_migrations_0009_adds_the_gate_columns_existing_checkpoints_promoted_on_postgres(pg_url):
    migration_0009_round_trip(pg_url)
    assert migrate.current_revision_of(pg_url) == migrate.head_revision()
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"truncate {', '.join(TABLES)} restart identity cascade")
