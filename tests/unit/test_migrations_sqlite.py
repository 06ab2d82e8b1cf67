"""The newest revisions up and down on SQLite: 0004 (decision probabilities, late rewards),
0005 (deferred activation), 0006 (apprentice mode's columns), 0007 (named and
per-request arm features), 0008 (the holdout's columns, guardrail metrics) and 0009 (the
evaluation gate's checkpoint status)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from rofu.service import migrate
from rofu.service.db.engine import make_engine
from tests.support import (
    insert_bare_decision,
    migration_0004_round_trip,
    migration_0005_round_trip,
    migration_0007_round_trip,
    migration_0008_round_trip,
    migration_0009_round_trip,
)

APPRENTICE_COLUMNS = {"baseline_arm", "rofu_arm", "rofu_probabilities"}


def test_migrations_0004_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0004_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision()


def test_migrations_0006_adds_and_drops_the_apprentice_columns_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migrate.upgrade(url, "0004")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            insert_bare_decision(connection, "m-1")
        for step in ("0006", "0004", "0006"):
            (migrate.upgrade if step == "0006" else migrate.downgrade)(url, step)
            engine.dispose()
            columns = {column["name"] for column in inspect(engine).get_columns("decisions")}
            assert (columns >= APPRENTICE_COLUMNS) is (step == "0006")
            assert not APPRENTICE_COLUMNS & columns or step == "0006"
            with engine.connect() as connection:
                assert connection.execute(text("select count(*) from decisions")).scalar() == 1
                if step == "0006":
                    query = "select baseline_arm, rofu_arm, rofu_probabilities from decisions"
                    assert tuple(connection.execute(text(query)).one()) == (None, None, None)
    finally:
        engine.dispose()
    assert migrate.current_revision_of(url) == "0006"


def test_migrations_0005_adds_and_drops_the_activation_columns_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0005_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision()


def test_migrations_0007_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0007_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision()


def test_migrations_0008_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0008_round_trip(url)
    assert migrate.current_revision_of(url) == "0008"


def test_migrations_0009_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0009_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision() == "0009"
