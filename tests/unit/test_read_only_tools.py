"""Commands that only read the database (`rofu export`, `rofu evaluate`) create nothing:
a wrong or relative URL is one line naming it, exit 2, and no file or folder appears."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rofu.service import migrate
from rofu.service.db.engine import MissingDatabase, existing_engine


def _rofu(cwd, *args, **env):
    return subprocess.run(
        [sys.executable, "-m", "rofu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    "command", [["export", "--format", "dsjson"], ["evaluate", "--out", "report"]]
)
def test_read_only_tool_refuses_a_missing_database_and_creates_nothing(tmp_path, command):
    result = _rofu(tmp_path, *command, ROFU_DATABASE_URL="sqlite:///var/rofu.sqlite")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"rofu {command[0]}: no rofu database at sqlite:///var/rofu.sqlite")
    assert str(tmp_path / "var" / "rofu.sqlite") in line
    assert list(tmp_path.iterdir()) == []


def test_existing_engine_refuses_a_file_without_rofu_tables(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    with pytest.raises(MissingDatabase, match="it has no rofu tables"):
        existing_engine(f"sqlite:///{empty}")


def test_existing_engine_hides_a_password_and_names_an_unreachable_server():
    url = "postgresql://rofu:hunter2@127.0.0.1:1/rofu"
    with pytest.raises(MissingDatabase) as caught:
        existing_engine(url)
    assert "hunter2" not in str(caught.value)
    assert "postgresql://rofu:***@127.0.0.1:1/rofu" in str(caught.value)


def test_existing_engine_opens_a_migrated_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'rofu.sqlite'}"
    migrate.upgrade(url)
    engine = existing_engine(url)
    engine.dispose()
