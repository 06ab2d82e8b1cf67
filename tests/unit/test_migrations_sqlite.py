"""The newest revisions up and down on SQLite: 0004 (decision probabilities, late rewards)
and 0005 (deferred activation)."""

from __future__ import annotations

from pathlib import Path

from service import migrate
from tests.support import migration_0004_round_trip, migration_0005_round_trip


def test_migrations_0004_upgrades_and_downgrades_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0004_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision()


def test_migrations_0005_adds_and_drops_the_activation_columns_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/migrate.sqlite"
    migration_0005_round_trip(url)
    assert migrate.current_revision_of(url) == migrate.head_revision()
