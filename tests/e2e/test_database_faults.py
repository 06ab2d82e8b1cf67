"""Database faults under a real `rofu serve` while real HTTP clients decide and reward.

1. A stalled Postgres: another session holds `LOCK TABLE decisions, rewards IN ACCESS
   EXCLUSIVE MODE` for longer than the bound.
2. A full SQLite database: the server's `max_page_count` is capped at the file's size
   (`tests/e2e/page_quota.py`: a full disk without root), then lifted.

Each asserts: no 500 and no dropped connection, every 503 with Retry-After; every answer
within a bound well below the fault's length (so no answer waited for the fault to end);
/readyz 503 during the fault, answered within its bound; every acknowledged reward stored
exactly once; the same process recovers by itself; the cause is counted in
rofu_database_errors_total and logged, rate-limited.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from rofu.service import migrate
from tests.e2e.test_faults import (
    ARMS,
    AUTH,
    DIM,
    Call,
    Client,
    assert_statuses,
    query,
    running_client,
    scratch_database,
    service_env,
    wait_for,
)
from tests.support import (
    ROOT,
    free_port,
    require_postgres,
    require_redis,
    stop_process,
    wait_until_ready,
)

BOUND_S = 8.0  # the longest any answer may take: several times each configured limit
HOLD_S = 15.0  # how long each fault lasts: well beyond BOUND_S
LOG_INTERVAL_S = 10.0  # rofu.service.db.faults logs each cause at most once per interval
UNLIMITED_PAGES = 1_073_741_823


@dataclass
class Probe:
    """One /readyz answer during a fault."""

    seconds: float
    status: int
    checks: dict[str, str]


@contextlib.contextmanager
def serve(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[str]:
    """A real `rofu serve` process (started by `command`); yields its base URL."""
    port = free_port()
    full_env = {**os.environ, **env, "ROFU_HOST": "127.0.0.1", "ROFU_PORT": str(port)}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base_url, process)
        yield base_url
        assert process.poll() is None, f"the service exited with {process.returncode}"
    except BaseException:
        print(log_path.read_text(errors="replace")[-6000:])
        raise
    finally:
        stop_process(process)


def decide(http: httpx.Client, prefix: str, n: int, seed: int) -> list[tuple[str, float]]:
    """`n` decisions made before the fault: (event id, the reward a client owes)."""
    rng = random.Random(seed)
    owed = []
    for i in range(n):
        context = [round(rng.gauss(0.0, 1.0), 4) for _ in range(DIM)]
        reply = http.post("/v1/select", json={"context": context, "event_id": f"{prefix}-{i}"})
        assert reply.status_code == 200, reply.text
        owed.append((f"{prefix}-{i}", round(rng.uniform(-1, 1), 4)))
    return owed


def readyz(http: httpx.Client) -> Probe:
    """/readyz, timed."""
    started = time.monotonic()
    reply = http.get("/readyz")
    return Probe(time.monotonic() - started, reply.status_code, reply.json()["checks"])


def database_errors(http: httpx.Client) -> dict[str, float]:
    """rofu_database_errors_total by cause, from the API's /metrics."""
    found = re.findall(
        r'^rofu_database_errors_total\{cause="(\w+)"\} (\S+)$',
        http.get("/metrics").text,
        re.MULTILINE,
    )
    return {cause: float(value) for cause, value in found}


def nonzero(counts: dict[str, float]) -> dict[str, float]:
    """The causes that were counted."""
    return {cause: n for cause, n in counts.items() if n}


def refused(clients: list[Client], path: str, since: float) -> list[Call]:
    """The clients' calls to `path` started at or after `since` that got a 503."""
    return [call for client in clients for call in client.answered(path, since, 503)]


def hold(seconds_from: float, http: httpx.Client, probes: list[Probe]) -> None:
    """Probe /readyz every half second until HOLD_S after `seconds_from`."""
    while time.monotonic() < seconds_from + HOLD_S:
        probes.append(readyz(http))
        time.sleep(0.5)


def check_outcome(
    clients: list[Client], stored: list[tuple[str, float]], acked: dict[str, float]
) -> None:
    """No 500, no dropped connection, every answer within the bound, every acknowledged
    reward (the clients' and `acked`) stored once with its value."""
    calls = [call for client in clients for call in client.calls]
    assert_statuses(calls, {200, 503})
    slowest = max(calls, key=lambda c: c.ended - c.started)
    assert slowest.ended - slowest.started <= BOUND_S, slowest
    counts = Counter(event_id for event_id, _ in stored)
    assert not [e for e, n in counts.items() if n != 1], "a reward stored twice"
    for client in clients:
        acked.update(client.acked)
    assert dict(stored) == acked, "stored rewards differ from the acknowledged ones"


def log_lines(log_path: Path, cause: str) -> list[str]:
    """The API's log lines about database failures of `cause`."""
    return [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if f"rofu.database database {cause} on " in line
    ]


def assert_rate_limited(lines: list[str], failures: float, seconds: float) -> None:
    """Logged, but at most one line per cause and interval, however many failures."""
    assert lines, "the cause was never logged"
    assert len(lines) <= seconds / LOG_INTERVAL_S + 2, lines
    assert failures > len(lines)


# 1. Postgres ------------------------------------------------------------------------------


def test_postgres_table_lock_gives_bounded_503s_then_recovers(tmp_path: Path) -> None:
    log_path = tmp_path / "api.log"
    with scratch_database(require_postgres()) as database:
        migrate.upgrade(database)
        env = service_env(
            database,
            require_redis(),
            ROFU_DB_LOCK_TIMEOUT_MS="1000",
            ROFU_DB_STATEMENT_TIMEOUT_MS="3000",
            ROFU_DB_POOL_TIMEOUT_SECONDS="2",
            ROFU_READYZ_TIMEOUT_SECONDS="2",
        )
        command = [sys.executable, "-m", "rofu.service.cli", "serve", "--log-level", "info"]
        probes: list[Probe] = []
        with (
            serve(command, env, log_path) as base_url,
            httpx.Client(base_url=base_url, headers=AUTH, timeout=30) as http,
            contextlib.ExitStack() as stack,
        ):
            owed = decide(http, "before", 60, seed=1)
            clients = [
                stack.enter_context(running_client(base_url, f"lock{i}", owed=owed[i::3], seed=i))
                for i in range(3)
            ]
            wait_for(lambda: sum(len(c.acked) for c in clients) >= 10, "rewards before")
            with psycopg.connect(database.replace("+psycopg", ""), autocommit=False) as holder:
                holder.execute("LOCK TABLE decisions, rewards IN ACCESS EXCLUSIVE MODE")
                locked_at = time.monotonic()
                wait_for(
                    lambda: (
                        len(refused(clients, "/v1/select", locked_at)) >= 5
                        and len(refused(clients, "/v1/reward", locked_at)) >= 5
                    ),
                    "503s to the clients under the lock",
                    timeout=HOLD_S,
                )
                hold(locked_at, http, probes)
                during = database_errors(http)
                holder.rollback()
            released_at = time.monotonic()
            wait_for(lambda: readyz(http).status == 200, "ready again", timeout=BOUND_S)
            wait_for(
                lambda: all(c.answered("/v1/reward", released_at) for c in clients),
                "every client's rewards acknowledged again",
                timeout=30,
            )
            for client in clients:
                client.pause(drain=True)  # every owed reward and every retry acknowledged
            for client in clients:
                client.halt()
        stored = query(database, "select event_id, value from rewards")
        decisions = dict(query(database, "select event_id, arm_id from decisions"))

    assert probes
    assert all(p.status == 503 and p.seconds <= BOUND_S for p in probes), probes
    assert {p.checks["database"] for p in probes} <= {"not writable", "timeout"}
    assert "lock_timeout" in {p.checks.get("database_cause") for p in probes}
    acked: dict[str, float] = {}
    check_outcome(clients, stored, acked)
    inside = [
        c for cl in clients for c in cl.calls if locked_at <= c.started < c.ended <= released_at
    ]
    assert inside
    assert all(c.status == 503 for c in inside), [c for c in inside if c.status != 503][:5]
    assert set(acked) >= {event_id for event_id, _ in owed}, "an owed reward never acked"
    assert all(decisions[e] == arm for c in clients for e, (arm, _) in c.decided.items())
    assert_rate_limited(log_lines(log_path, "lock_timeout"), during["lock_timeout"], HOLD_S)
    calls = [call for client in clients for call in client.calls]
    print(
        f"\npostgres lock held {released_at - locked_at:.1f}s: "
        f"{Counter(c.status for c in calls)} over {len(calls)} client calls, slowest "
        f"{max(c.ended - c.started for c in calls):.2f}s; /readyz 503 x{len(probes)}, "
        f"slowest {max(p.seconds for p in probes):.2f}s; {nonzero(during)} counted, "
        f"{len(log_lines(log_path, 'lock_timeout'))} log lines; {len(stored)} rewards "
        "stored, each once, as acknowledged"
    )


# 2. SQLite --------------------------------------------------------------------------------


def sqlite_env(path: Path, pages: Path) -> dict[str, str]:
    """The embedded service on `path`, with its page limit in `pages`."""
    return {
        "ROFU_DATABASE_URL": f"sqlite:///{path}",
        "ROFU_TEST_MAX_PAGES_FILE": str(pages),
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_ARMS": json.dumps([{"id": arm} for arm in ARMS]),
        "ROFU_MAX_ARMS": str(len(ARMS)),
        "ROFU_HIDDEN": "[16]",
        "ROFU_DEVICE": "cpu",
        "ROFU_EMBEDDED_TRAINER": "false",
        "ROFU_CHECKPOINT_POLL_SECONDS": "1",
        "ROFU_SQLITE_BUSY_TIMEOUT_MS": "1000",
        "ROFU_DB_POOL_TIMEOUT_SECONDS": "2",
        "OMP_NUM_THREADS": "1",
    }


def post_until_refused(
    http: httpx.Client, rewards: list[tuple[str, float]], acked: dict[str, float]
) -> list[tuple[str, float]]:
    """Post rewards until one is refused (a 503: the table needs a new page); returns
    the rewards not acknowledged."""
    for i, (event_id, value) in enumerate(rewards):
        reply = http.post("/v1/reward", json={"event_id": event_id, "value": value})
        if reply.status_code == 503:
            assert reply.headers["retry-after"].isdigit(), reply.headers
            assert "disk_full" in reply.json()["error"]["message"], reply.text
            return rewards[i:]
        assert reply.status_code == 200, reply.text
        acked[event_id] = reply.json()["value"]
    raise AssertionError(f"{len(rewards)} rewards stored in a full database")


def test_sqlite_full_database_gives_bounded_503s_then_recovers(tmp_path: Path) -> None:
    log_path, path, pages = tmp_path / "api.log", tmp_path / "rofu.sqlite", tmp_path / "pages"
    command = [sys.executable, "-m", "tests.e2e.page_quota", "--log-level", "info"]
    probes: list[Probe] = []
    acked: dict[str, float] = {}  # the test's own rewards, acknowledged
    with (
        serve(command, sqlite_env(path, pages), log_path) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
        contextlib.ExitStack() as stack,
    ):
        owed = decide(http, "before", 300, seed=2)
        mine, owed = owed[:150], owed[150:]  # posted by the test until the table is full
        clients = [
            stack.enter_context(running_client(base_url, f"full{i}", owed=owed[i::2], seed=i))
            for i in range(2)
        ]
        wait_for(lambda: sum(len(c.acked) for c in clients) >= 10, "rewards before")
        pages.write_text("1")  # capped at the current size: full
        full_at = time.monotonic()
        left = post_until_refused(http, mine, acked)
        wait_for(
            lambda: len(refused(clients, "/v1/select", full_at)) >= 5,
            "503s to the clients' decisions",
            timeout=HOLD_S,
        )
        hold(full_at, http, probes)
        during = database_errors(http)
        pages.write_text(str(UNLIMITED_PAGES))
        lifted_at = time.monotonic()
        wait_for(lambda: readyz(http).status == 200, "ready again", timeout=BOUND_S)
        for event_id, value in left:  # retried after the outage, as a client would
            reply = http.post("/v1/reward", json={"event_id": event_id, "value": value})
            assert reply.status_code == 200, reply.text
            acked[event_id] = reply.json()["value"]
        wait_for(
            lambda: all(c.answered("/v1/select", lifted_at) for c in clients),
            "every client's decisions stored again",
            timeout=30,
        )
        for client in clients:
            client.pause(drain=True)
        for client in clients:
            client.halt()
    with contextlib.closing(sqlite3.connect(path)) as connection:
        stored = connection.execute("select event_id, value from rewards").fetchall()
        decisions = dict(connection.execute("select event_id, arm_id from decisions"))

    assert probes
    assert all(p.status == 503 and p.seconds <= BOUND_S for p in probes), probes
    assert {(p.checks["database"], p.checks.get("database_cause")) for p in probes} == {
        ("not writable", "disk_full")
    }
    check_outcome(clients, stored, acked)
    assert set(acked) >= {event_id for event_id, _ in owed + mine}, "an owed reward never acked"
    assert all(decisions[e] == arm for c in clients for e, (arm, _) in c.decided.items())
    assert_rate_limited(log_lines(log_path, "disk_full"), during["disk_full"], HOLD_S)
    calls = [call for client in clients for call in client.calls]
    print(
        f"\nsqlite full for {lifted_at - full_at:.1f}s: "
        f"{Counter(c.status for c in calls)} over {len(calls)} client calls, slowest "
        f"{max(c.ended - c.started for c in calls):.2f}s; the test's rewards refused after "
        f"{len(mine) - len(left)} fitted; /readyz 503 x{len(probes)}, slowest "
        f"{max(p.seconds for p in probes):.2f}s; {nonzero(during)} counted, "
        f"{len(log_lines(log_path, 'disk_full'))} log lines; {len(stored)} rewards stored, "
        "each once, as acknowledged"
    )
