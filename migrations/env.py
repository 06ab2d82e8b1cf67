"""Alembic environment: the URL comes from the settings (or `config.attributes["url"]`)."""

from __future__ import annotations

from alembic import context

from rofu.service.db.engine import make_engine
from rofu.service.db.tables import Base
from rofu.service.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url")
    return str(url) if url else get_settings().database_url


def run_offline() -> None:
    """Emit SQL without a connection (`alembic upgrade --sql`)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate over a live connection."""
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
