"""/readyz follows the process's writes under a real `rofu serve`: the SQLite file, its WAL
and its folder made immutable (`chattr +i`, a real OS condition that also stops writes
through descriptors opened before it, and one that binds root, unlike chmod) while the
server runs. The readiness probe's own write is rolled back and never touches the WAL,
so only the failing writes of requests can show it; once the files are writable again,
/readyz turns 200 with no traffic at all (its probe then commits a write itself)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support import service_process, unavailable

BOUND_S = 2.0  # ROFU_READYZ_WRITE_FAILURE_SECONDS in this test
PATIENCE_S = 30.0  # how long the test waits for /readyz to change (far above BOUND_S)


def _env(database: Path) -> dict[str, str]:
    return {
        "ROFU_DATABASE_URL": f"sqlite:///{database}",
        "ROFU_CONTEXT_DIM": "3",
        "ROFU_ARMS": json.dumps([{"id": arm} for arm in ("a", "b", "c")]),
        "ROFU_MAX_ARMS": "3",
        "ROFU_HIDDEN": "[8]",
        "ROFU_DEVICE": "cpu",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_READYZ_WRITE_FAILURE_SECONDS": str(BOUND_S),
        "OMP_NUM_THREADS": "1",
    }


@contextlib.contextmanager
def immutable(paths: list[Path]) -> Iterator[None]:
    """`paths` immutable for the block (where `chattr +i` is refused: a failure in CI, a
    skip elsewhere, as `tests.support.unavailable` says)."""
    chattr = shutil.which("chattr")
    if chattr is None:
        unavailable("chattr", FileNotFoundError("no chattr to make a file immutable"))
    assert chattr is not None
    done = subprocess.run([chattr, "+i", *map(str, paths)], capture_output=True, check=False)
    try:
        if done.returncode != 0:
            unavailable("chattr +i", PermissionError(done.stderr.decode().strip()))
        yield
    finally:
        subprocess.run([chattr, "-i", *map(str, paths)], capture_output=True, check=False)


def select(http: httpx.Client, event_id: str) -> httpx.Response:
    return http.post("/v1/select", json={"context": [0.1, -0.2, 0.3], "event_id": event_id})


def test_readyz_turns_503_while_the_sqlite_file_is_read_only_then_200(tmp_path: Path) -> None:
    database = tmp_path / "db" / "rofu.sqlite"
    with (
        service_process(_env(database), tmp_path / "api.log") as base_url,
        httpx.Client(base_url=base_url, timeout=20) as http,
    ):
        assert [select(http, f"before-{i}").status_code for i in range(3)] == [200] * 3
        assert http.get("/readyz").status_code == 200
        wal = database.with_name(database.name + "-wal")
        with immutable([database, wal, database.parent]):
            refused, probes = [], []
            deadline = time.monotonic() + PATIENCE_S
            while time.monotonic() < deadline and not (probes and probes[-1].status_code == 503):
                refused.append(select(http, f"during-{len(refused)}"))
                probes.append(http.get("/readyz"))
                time.sleep(0.2)
            read_back = select(http, "before-0")  # a stored decision still reads back
        recovered = wait_ready(http)
        after = select(http, "after")

    assert probes[-1].status_code == 503, "/readyz stayed 200 while every write failed"
    assert all(r.status_code == 503 for r in refused), [r.text for r in refused]
    checks = probes[-1].json()["checks"]
    assert checks["database"] == "not writable"
    assert checks["database_cause"] in {"io_error", "read_only"}
    assert checks["database_detail"].startswith("writes failing for ")
    assert "OperationalError" in checks["database_detail"]
    assert read_back.status_code == 200
    assert recovered.json()["checks"]["database"] == "ok"
    assert after.status_code == 200


def wait_ready(http: httpx.Client) -> httpx.Response:
    """/readyz until it answers 200, sending nothing else (no write to succeed by)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        reply = http.get("/readyz")
        if reply.status_code == 200 or time.monotonic() > deadline:
            assert reply.status_code == 200, reply.text
            return reply
        time.sleep(0.2)
