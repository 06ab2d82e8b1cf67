"""Fixtures of the end-to-end tests that start processes against the shared test servers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rofu.service import migrate
from tests.support import require_postgres


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh, migrated database on the shared test server."""
    from tests.e2e.test_faults import scratch_database

    with scratch_database(require_postgres()) as url:
        migrate.upgrade(url)
        yield url


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Log files for the processes a test starts; their tails are printed at teardown,
    which pytest shows when the test fails."""
    paths: list[Path] = []

    def log(name: str) -> Path:
        paths.append(tmp_path / f"{name}.log")
        return paths[-1]

    yield log
    for path in paths:
        if path.exists():
            print(f"----- {path.name} (tail) -----\n{path.read_text(errors='replace')[-4000:]}")
