"""Test tiers come from the folder a test lives in: unit, integration, e2e, sim."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "sim")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the tier of its folder; refuse tests outside the tiers."""
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.fspath).resolve().relative_to(root).parts
        tier = parts[0] if parts else ""
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid} is not under tests/{{{','.join(TIERS)}}}")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the server's loop)."""
    return "asyncio"


@pytest.fixture
def sqlite_settings(tmp_path: Path):
    """Embedded settings on a fresh SQLite file; no background trainer (tests drive it)."""
    from rofu.service.settings import Settings

    return Settings(
        database_url=f"sqlite:///{tmp_path}/rofu.sqlite",
        context_dim=4,
        hidden=(16,),
        embedded_trainer=False,
        reward_window_seconds=0.0,
        fit_steps=30,
        checkpoint_poll_seconds=0.2,
    )
