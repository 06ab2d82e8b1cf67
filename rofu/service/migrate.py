"""Running Alembic from code: the CLI, the embedded start-up and the tests use this."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from rofu.service.db.engine import MissingDatabase, existing_engine, make_engine

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    """An Alembic config for the repository's migrations, bound to `url`."""
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` up to `revision`."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (e.g. "base" or "-1")."""
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The newest revision of the repository's migrations."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def current_revision_of(url: str) -> str | None:
    """The revision of the database at `url`."""
    engine = make_engine(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def migrated_engine(url: str) -> Engine:
    """An engine on an existing rofu database whose schema is at the head revision, for
    commands that write into a database they do not create (`rofu import`, `rofu train`).

    Raises:
        MissingDatabase: no rofu database at `url` (`existing_engine`), or one not
            migrated to the head (run `rofu migrate`).
    """
    engine = existing_engine(url)
    current, head = current_revision(engine), head_revision()
    if current != head:
        engine.dispose()
        raise MissingDatabase(
            f"the database schema is at {current}, not {head}: run `rofu migrate`"
        )
    return engine
