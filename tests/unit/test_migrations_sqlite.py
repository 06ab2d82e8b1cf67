"""The newest revisions (0004: decision probabilities, late rewards; 0007: named and
per-request arm features) up and down on SQLite."""

from __future__ import annotations

from pathlib import Path

from service import migrate
from tests.support import migration_0004_round_trip, migration_0007_round_trip


def test_migrations_0004_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0004_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision() == "0007"


def test_migrations_0007_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0007_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision() == "0007"
