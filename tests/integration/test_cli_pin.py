"""`rofu pin` / `rofu unpin` and `rofu promote` / `rofu reject` against the real Postgres."""

from __future__ import annotations

import os
import subprocess
import sys

from rofu.service.db import gate_status, repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.settings import Settings
from tests.support import ROOT, seed_checkpoint


def _rofu(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROFU_DATABASE_URL": url, "ROFU_CONTEXT_DIM": "3", "ROFU_HIDDEN": "[8]"}
    return subprocess.run(
        [sys.executable, "-m", "rofu.service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_pin_and_unpin(pg_clean):
    settings = Settings(database_url=pg_clean, context_dim=3, hidden=(8,))
    for version in (1, 2):
        seed_checkpoint(settings, n_rows=20, version=version)
    engine = make_engine(pg_clean)
    sessions = session_factory(engine)

    pinned = _rofu(pg_clean, "pin", "1")
    assert (pinned.returncode, pinned.stdout.strip()) == (0, "pinned: 1")
    assert repository.get_pin(sessions) == 1
    assert _rofu(pg_clean, "pin").stdout.strip() == "pinned: 1"

    missing = _rofu(pg_clean, "pin", "7")
    assert missing.returncode == 1
    assert "no checkpoint with version 7" in missing.stderr
    assert repository.get_pin(sessions) == 1

    unpinned = _rofu(pg_clean, "unpin")
    assert unpinned.returncode == 0
    assert "not pinned" in unpinned.stdout
    assert repository.get_pin(sessions) is None
    engine.dispose()


def test_cli_promote_and_reject(pg_clean):
    settings = Settings(database_url=pg_clean, context_dim=3, hidden=(8,))
    for version in (1, 2):
        seed_checkpoint(settings, n_rows=20, version=version)
    engine = make_engine(pg_clean)
    sessions = session_factory(engine)
    gate_status.mark(sessions, 2, "candidate", {})

    promoted = _rofu(pg_clean, "promote", "2", "--reason", "checked by hand")
    assert (promoted.returncode, promoted.stdout.strip()) == (
        0,
        "checkpoint 2: promoted; served: 2",
    )
    rejected = _rofu(pg_clean, "reject", "2", "--reason", "bad batch")
    assert (rejected.returncode, rejected.stdout.strip()) == (
        0,
        "checkpoint 2: rejected; served: 1",
    )
    row = repository.get_checkpoint(sessions, 2, with_blob=False)
    assert row is not None
    assert (row.gate_status, row.gate["reason"], row.gate["by"]) == (
        "rejected",
        "bad batch",
        "operator",
    )

    only = _rofu(pg_clean, "reject", "1")
    assert only.returncode == 1
    assert only.stderr.strip().splitlines() == [
        "rofu reject: checkpoint 1 is the only promoted checkpoint: rejecting it would leave "
        "nothing to serve (promote another first)"
    ]
    missing = _rofu(pg_clean, "promote", "7")
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "rofu promote: no checkpoint with version 7",
    )
    assert repository.latest_checkpoint(sessions, with_blob=False).version == 1
    engine.dispose()
