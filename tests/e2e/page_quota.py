"""`rofu serve` with SQLite's page limit read from a file: a full disk without root.

Before each transaction every SQLite connection of the process sets `PRAGMA
max_page_count` to the number in the file named by ROFU_TEST_MAX_PAGES_FILE (SQLite keeps
it at least the file's current size, so "1" means: full now); an absent or empty file
lifts the limit. Writes that need a new page then fail with SQLITE_FULL ("database or
disk is full"), as on a full disk.

    python -m tests.e2e.page_quota [rofu serve options]
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import Pool

UNLIMITED = 1_073_741_823


def install(limit_file: Path) -> None:
    """Apply the file's page limit at every pool checkout in this process."""

    def limit(dbapi_connection: Any, *_: object) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            text = limit_file.read_text().strip() if limit_file.exists() else ""
            dbapi_connection.execute(f"PRAGMA max_page_count = {int(text or UNLIMITED)}")

    event.listen(Pool, "checkout", limit)


def main() -> int:
    """Install the limit, then run `rofu serve` with the given options."""
    install(Path(os.environ["ROFU_TEST_MAX_PAGES_FILE"]))
    from rofu.service.cli import main as cli

    return cli(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
