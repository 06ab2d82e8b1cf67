"""Faults with real processes while a real HTTP client keeps deciding and rewarding.

1. Redis stops and comes back: the API answers every request from its last checkpoint,
   the trainer keeps training and storing (its failed publishes are counted), and the
   API's bus listener reconnects by itself and follows the trainer again. The database
   poll is set to an hour, so the recovery can only come from the bus.
2. Postgres (a private cluster) crashes and comes back: /select and /reward answer 503
   with Retry-After, never a 2xx; /healthz stays 200 and /readyz turns 503; the same API
   process recovers by itself, and every acknowledged reward is stored exactly once.
3. The trainer is SIGKILLed mid-fit: no partial checkpoint, the API keeps serving the
   previous version, and a new trainer resumes from it.
4. An API process is SIGKILLed and restarted: it reports ready only once the newest
   checkpoint is loaded.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from rofu.models import load_checkpoint
from rofu.service import migrate
from rofu.service.settings import ArmSpec, Settings
from tests.support import (
    ROOT,
    free_port,
    private_redis,
    require_redis,
    reset_postgres,
    seed_checkpoint,
    service_process,
    stop_process,
    unavailable,
    wait_until_ready,
)

DIM = 3
ARMS = ("a", "b", "c")
CLIENT_KEY = "faults-client-key-0123456789"
ADMIN_KEY = "faults-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
T = TypeVar("T")


# Waiting, processes, databases ------------------------------------------------------


def wait_for(check: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.1) -> T:
    """Poll `check()` until it is truthy and return it; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s (last: {value!r})")
        time.sleep(interval)


def service_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """Production settings for the API and the trainer: small network, fast schedule."""
    env = {
        "ROFU_MODE": "production",
        "ROFU_GATE": "off",  # each checkpoint served once stored (test_gate_pg.py: the gate)
        "ROFU_DATABASE_URL": database_url,
        "ROFU_REDIS_URL": redis_url,
        "ROFU_REDIS_PREFIX": f"faults-{uuid.uuid4().hex[:8]}",
        "ROFU_API_KEYS": json.dumps([CLIENT_KEY]),
        "ROFU_ADMIN_API_KEYS": json.dumps([ADMIN_KEY]),
        "ROFU_CONTEXT_DIM": str(DIM),
        "ROFU_ARMS": json.dumps([{"id": arm} for arm in ARMS]),
        "ROFU_MAX_ARMS": str(len(ARMS)),
        "ROFU_HIDDEN": "[16]",
        "ROFU_DEVICE": "cpu",
        "ROFU_REWARD_WINDOW_SECONDS": "0",
        "ROFU_TRAIN_EVERY_REWARDS": "10",
        "ROFU_TRAIN_INTERVAL_SECONDS": "1",
        "ROFU_FIT_STEPS": "20",
        "ROFU_TRAINER_METRICS_PORT": "0",
        "ROFU_CHECKPOINT_POLL_SECONDS": "1",
        "ROFU_STARTUP_TIMEOUT_SECONDS": "30",
        "OMP_NUM_THREADS": "1",  # several processes share a small machine
    }
    return {**env, **extra}


@contextlib.contextmanager
def trainer_process(
    env: dict[str, str], log_path: Path, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`rofu trainer` as a real process; SIGTERM (then SIGKILL) on the way out."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "rofu.service.cli", "trainer"],
            cwd=ROOT,
            env={**os.environ, **env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        stop_process(process)


def spawn_api(env: dict[str, str], log_path: Path, port: int) -> subprocess.Popen[bytes]:
    """`rofu serve` on `port`, without waiting for it: the caller watches it come up."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "rofu.service.cli", "serve", "--log-level", "info"],
            cwd=ROOT,
            env={**os.environ, **env, "ROFU_HOST": "127.0.0.1", "ROFU_PORT": str(port)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of one query, on a connection of its own."""
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, connect_timeout=5) as connection:
        return connection.execute(sql, params or None).fetchall()


def stored_versions(url: str) -> list[int]:
    """Checkpoint versions in the database, oldest first."""
    return [row[0] for row in query(url, "select version from checkpoints order by version")]


def newest_stored(url: str) -> int:
    """The newest stored checkpoint version (0: none)."""
    return max(stored_versions(url), default=0)


def untrained_decisions(url: str) -> int:
    """Decisions no training run has consumed yet."""
    return int(query(url, "select count(*) from decisions where trained_in is null")[0][0])


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A database of its own on the server of `server_url`, dropped afterwards.

    Concurrent test sessions reset the shared test database; a database of its own keeps
    them from doing so under a running fault test. A server that refuses CREATE DATABASE
    gets the shared test database, reset.
    """
    plain = server_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"rofu_faults_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(plain, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'create database "{name}"')
    except psycopg.errors.InsufficientPrivilege:
        reset_postgres(plain)
        yield server_url
        return
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(plain, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


# A private Postgres cluster -------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """A directory holding initdb and pg_ctl: on PATH, else the newest Debian install."""
    candidates = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)

    def major(path: str) -> float:
        version = Path(path).parent.name
        return float(version) if version.replace(".", "", 1).isdigit() else 0.0

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major)[::-1]]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


class PostgresCluster:
    """A Postgres cluster of a test's own (initdb, trust auth, 127.0.0.1 only) that the
    test can crash and start again under a running service."""

    def __init__(self, bindir: Path, root: Path, as_owner: list[str]) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self._as_owner = as_owner

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as_owner, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def _must(self, tool: str, *args: str) -> None:
        result = self._run(tool, *args)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(
                f"{tool} {' '.join(args)} exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}\n{tail}"
            )

    def initdb(self) -> None:
        """Create the cluster: superuser `postgres`, trust authentication."""
        options = ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
        self._must("initdb", "-D", str(self.data), *options)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        log = str(self.root / "server.log")
        self._must("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: a crash, WAL recovery on the next start)."""
        self._must("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        """Whether the server is up."""
        return self._run("pg_ctl", "-D", str(self.data), "status").returncode == 0

    def url(self, database: str = "postgres") -> str:
        """The URL of one of its databases."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create a database; returns its URL."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'create database "{name}"')
        return self.url(name)


@pytest.fixture
def private_postgres() -> Iterator[PostgresCluster]:
    """A started private cluster (skipped without the binaries, failed under CI's
    ROFU_REQUIRE_SERVICES=1), removed afterwards."""
    bindir = postgres_bindir()
    if bindir is None:
        missing = FileNotFoundError("no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin")
        unavailable("a private Postgres cluster", missing)
        raise AssertionError("unreachable")
    as_owner: list[str] = []
    owner = None
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to `postgres`
        runuser = shutil.which("runuser")
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError as exc:
            unavailable("a private Postgres cluster (no `postgres` user to run it)", exc)
        if runuser is None:
            unavailable("a private Postgres cluster", FileNotFoundError("runuser"))
        as_owner = [str(runuser), "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="rofu-faults-pg-"))
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    cluster = PostgresCluster(bindir, root, as_owner)
    try:
        cluster.initdb()
        cluster.start()
        yield cluster
    finally:
        if cluster.running():
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# The client -----------------------------------------------------------------------------


@dataclass
class Call:
    """One HTTP exchange of the client."""

    path: str
    event_id: str
    attempt: int
    started: float  # time.monotonic()
    ended: float
    status: int | None  # None: no HTTP answer (refused, reset)
    retry_after: str | None = None
    version: int | None = None  # model_version of a 2xx /select
    detail: str = ""


class Client(threading.Thread):
    """An app in a background thread: /select a context, /reward the decision, over and
    over, recording every exchange.

    Like a real client it retries a 503 after its Retry-After (and a lost connection
    after 0.5 s) with the same body, so a retried /select keeps its event_id and a
    retried /reward its value; with `max_pending` retries waiting it starts nothing new.
    `owed` rewards (for decisions made before) alternate with new decisions.
    """

    def __init__(
        self,
        base_url: str,
        name: str,
        owed: Iterable[tuple[str, float]] = (),
        max_pending: int = 16,
        pace_s: float = 0.02,
        seed: int = 0,
    ) -> None:
        super().__init__(name=f"client-{name}", daemon=True)
        self.base_url = base_url
        self.calls: list[Call] = []
        self.decided: dict[str, tuple[str, int]] = {}  # event id -> (arm, version), 2xx only
        self.acked: dict[str, float] = {}  # event id -> value of a 2xx /reward
        self.crash: str | None = None
        self._prefix = name
        self._owed = deque(owed)
        self._rewards: deque[tuple[str, float]] = deque()  # for this client's decisions
        self._retries: list[tuple[float, int, str, dict[str, Any], int]] = []
        self._max_pending = max_pending
        self._pace_s = pace_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._mode = "run"  # run | drain (finish what is owed, start nothing) | pause
        self._busy = False
        self._halt = threading.Event()
        self._n = 0  # decisions made
        self._turn = 0  # owed rewards alternate with new decisions
        self._seq = 0  # orders retries due at the same moment

    # What to send next --------------------------------------------------------------

    def _next(self) -> tuple[str, dict[str, Any], int] | None:
        now = time.monotonic()
        with self._lock:
            job = None
            due = [entry for entry in self._retries if entry[0] <= now]
            if self._mode == "pause":
                pass
            elif due:
                entry = min(due)
                self._retries.remove(entry)
                job = (entry[2], entry[3], entry[4] + 1)
            elif len(self._retries) < self._max_pending:
                self._turn += 1
                if self._rewards:
                    event_id, value = self._rewards.popleft()
                    job = ("/v1/reward", {"event_id": event_id, "value": value}, 1)
                elif self._owed and (self._turn % 2 == 0 or self._mode == "drain"):
                    event_id, value = self._owed.popleft()
                    job = ("/v1/reward", {"event_id": event_id, "value": value}, 1)
                elif self._mode == "run":
                    self._n += 1
                    context = [round(self._rng.gauss(0.0, 1.0), 4) for _ in range(DIM)]
                    body = {"context": context, "event_id": f"{self._prefix}-{self._n}"}
                    job = ("/v1/select", body, 1)
            self._busy = job is not None
            return job

    def _retry(self, delay: float, path: str, body: dict[str, Any], attempt: int) -> None:
        with self._lock:
            self._seq += 1
            self._retries.append((time.monotonic() + delay, self._seq, path, body, attempt))

    def _send(self, http: httpx.Client, path: str, body: dict[str, Any], attempt: int) -> None:
        started = time.monotonic()
        try:
            reply = http.post(path, json=body)
        except httpx.TransportError as exc:
            failed = Call(path, body["event_id"], attempt, started, time.monotonic(), None)
            failed.detail = type(exc).__name__
            self.calls.append(failed)
            self._retry(0.5, path, body, attempt)
            return
        call = Call(path, body["event_id"], attempt, started, time.monotonic(), reply.status_code)
        call.retry_after = reply.headers.get("retry-after")
        if not reply.is_success:
            call.detail = reply.text[:300]
        if reply.status_code == 503:
            wait = call.retry_after or ""
            self._retry(float(wait) if wait.isdigit() else 1.0, path, body, attempt)
        elif reply.is_success and path == "/v1/select":
            data = reply.json()
            call.version = data["model_version"]
            with self._lock:
                self.decided[body["event_id"]] = (data["arm"], data["model_version"])
                self._rewards.append((body["event_id"], round(self._rng.uniform(-1, 1), 4)))
        elif reply.is_success:
            value = reply.json()["value"]
            if value != body["value"]:
                call.detail = f"acknowledged {value}, sent {body['value']}"
            self.acked[body["event_id"]] = value
        self.calls.append(call)

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.base_url, headers=AUTH, timeout=10) as http:
                while not self._halt.is_set():
                    job = self._next()
                    if job is None:
                        time.sleep(0.02)  # nothing due yet
                        continue
                    try:
                        self._send(http, *job)
                    finally:
                        with self._lock:
                            self._busy = False
                    time.sleep(self._pace_s)
        except BaseException:
            self.crash = traceback.format_exc()

    # Steering from the test -----------------------------------------------------------

    def pause(self, drain: bool = False, timeout: float = 60.0) -> None:
        """Start nothing new and wait until no request is in flight; with `drain`, first
        send every owed reward and retry until each is acknowledged."""
        with self._lock:
            self._mode = "drain" if drain else "pause"

        def settled() -> bool:
            with self._lock:
                left = self._rewards or self._owed or self._retries
                return not self._busy and not (drain and left)

        wait_for(settled, "the client to settle", timeout, interval=0.02)
        with self._lock:
            self._mode = "pause"
        assert self.crash is None, self.crash

    def resume(self) -> None:
        """Go on deciding and rewarding."""
        with self._lock:
            self._mode = "run"

    def halt(self) -> None:
        """End the thread (what is in flight finishes)."""
        self._halt.set()
        self.join(15)
        assert not self.is_alive(), "the client thread did not end"
        assert self.crash is None, self.crash

    def answered(self, path: str, since: float, status: int | None = 200) -> list[Call]:
        """Calls to `path` started at or after `since` that got `status`."""
        assert self.crash is None, self.crash
        return [
            c
            for c in list(self.calls)
            if c.path == path and c.started >= since and c.status == status
        ]


@contextlib.contextmanager
def running_client(base_url: str, name: str, **options: Any) -> Iterator[Client]:
    """A started `Client`, ended on the way out."""
    client = Client(base_url, name, **options)
    client.start()
    try:
        yield client
    finally:
        client._halt.set()
        client.join(15)


def assert_statuses(calls: list[Call], allowed: set[int | None]) -> None:
    """Every answer is one of `allowed`; every 503 carries a Retry-After in seconds."""
    unexpected = [c for c in calls if c.status not in allowed]
    assert not unexpected, unexpected[:5]
    bad_retry = [c for c in calls if c.status == 503 and not (c.retry_after or "").isdigit()]
    assert not bad_retry, bad_retry[:5]
    wrong_value = [c for c in calls if c.detail.startswith("acknowledged")]
    assert not wrong_value, wrong_value[:5]


def model(http: httpx.Client) -> dict[str, Any]:
    """The API's /model answer."""
    reply = http.get("/v1/model")
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    return data


def metric(port: int, name: str) -> float:
    """A sample of the trainer's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from the trainer's /metrics")


# 1. Redis ---------------------------------------------------------------------------------


def test_redis_outage_api_keeps_serving_and_follows_the_trainer_again(database, logs):
    with private_redis() as (redis_url, stop_redis, start_redis):
        env = service_env(database, redis_url, ROFU_CHECKPOINT_POLL_SECONDS="3600")
        metrics_port = free_port()
        trainer_log = logs("trainer")
        with (
            trainer_process(
                env, trainer_log, ROFU_TRAINER_METRICS_PORT=str(metrics_port)
            ) as trainer,
            service_process(env, logs("api")) as base_url,
            httpx.Client(base_url=base_url, headers=AUTH, timeout=10) as http,
            running_client(base_url, "redis") as client,
        ):
            wait_for(lambda: model(http)["version"] >= 2, "the API following the trainer")
            assert metric(metrics_port, "rofu_trainer_publish_failures_total") == 0

            stop_redis()
            down_at = time.monotonic()
            stored_at_stop = newest_stored(database)
            wait_for(  # the trainer keeps training and storing; every publish fails
                lambda: (
                    newest_stored(database) >= stored_at_stop + 2
                    and metric(metrics_port, "rofu_trainer_publish_failures_total") >= 2
                ),
                "the trainer storing checkpoints while Redis is down",
            )
            wait_for(lambda: len(client.answered("/v1/select", down_at)) >= 20, "outage traffic")
            serving_down = model(http)["version"]
            stored_down = newest_stored(database)
            failures_down = metric(metrics_port, "rofu_trainer_publish_failures_total")
            assert serving_down < stored_down, "nothing for the API to catch up on"
            assert trainer.poll() is None, "the trainer died with Redis"

            up_at = time.monotonic()
            start_redis()  # empty: the API must reconnect and catch up on its own
            wait_for(
                lambda: model(http)["version"] >= stored_down, "the API catching up", timeout=30
            )
            caught_up_s = time.monotonic() - up_at
            next_version = newest_stored(database) + 1
            wait_for(lambda: model(http)["version"] >= next_version, "a new checkpoint served")
            follow_s = time.monotonic() - up_at
            followed_at = time.monotonic()
            wait_for(lambda: len(client.answered("/v1/select", followed_at)) >= 5, "traffic after")
            pointer = redis.Redis.from_url(redis_url)
            try:
                latest = pointer.get(f"{env['ROFU_REDIS_PREFIX']}:checkpoint:latest")
            finally:
                pointer.close()
            assert latest is not None, "nothing published after Redis came back"
            assert int(latest) >= next_version, "the trainer publishes again"
            assert metric(metrics_port, "rofu_trainer_failures_total") == 0
            client.halt()
            assert trainer.poll() is None

    calls = client.calls
    assert_statuses(calls, {200})  # nothing failed, before, during or after the outage
    outage = [c for c in calls if c.started >= down_at and c.ended <= up_at]
    selects = [c for c in outage if c.path == "/v1/select"]
    versions = [c.version for c in selects]
    assert len(selects) >= 20
    assert all(v is not None and 2 <= v <= serving_down for v in versions), versions
    assert versions == sorted(versions), "the served version never goes back"
    later = [c.version or 0 for c in calls if c.path == "/v1/select" and c.started >= followed_at]
    assert later
    assert min(later) >= next_version
    assert "publishing checkpoint" in trainer_log.read_text()
    print(
        f"\nredis outage: {len(outage)} requests during the outage, all 200 "
        f"({len(selects)} /select, versions {sorted(set(versions))}); trainer stored "
        f"v{stored_at_stop + 1}..v{stored_down} with Redis down ({failures_down:.0f} publish "
        f"failures counted); API caught up to v{stored_down} {caught_up_s:.1f}s after Redis "
        f"came back, served v{next_version} after {follow_s:.1f}s"
    )


# 2. Postgres ------------------------------------------------------------------------------


def test_postgres_outage_answers_503_then_recovers_without_losing_rewards(private_postgres, logs):
    database = private_postgres.create_database("rofu")
    migrate.upgrade(database)
    env = service_env(database, require_redis())
    settings = Settings(
        database_url=database,
        context_dim=DIM,
        arms=[ArmSpec(id=arm) for arm in ARMS],
        max_arms=len(ARMS),
        hidden=(16,),
    )
    rng = random.Random(2)
    with (
        service_process(env, logs("api")) as base_url,
        httpx.Client(base_url=base_url, headers=AUTH, timeout=10) as http,
    ):
        owed = []  # rewards still due for decisions made before the outage
        for i in range(80):
            context = [round(rng.gauss(0.0, 1.0), 4) for _ in range(DIM)]
            reply = http.post("/v1/select", json={"context": context, "event_id": f"before-{i}"})
            assert reply.status_code == 200, reply.text
            owed.append((f"before-{i}", round(i / 80 - 0.5, 4)))
        abandoned, owed = owed[:6], owed[6:]  # posted once during the outage, never retried

        with running_client(base_url, "pg", owed=owed) as client:
            wait_for(lambda: len(client.acked) >= 10, "rewards flowing before the outage")
            private_postgres.stop("immediate")  # a crash: recovery replays the WAL
            down_at = time.monotonic()
            healthz = http.get("/healthz").status_code
            readyz = http.get("/readyz")
            refused = [
                http.post("/v1/reward", json={"event_id": event_id, "value": value})
                for event_id, value in abandoned
            ]
            context = [0.1, 0.2, 0.3]
            refused.append(http.post("/v1/select", json={"context": context, "event_id": "lost"}))
            wait_for(  # the client's own traffic, and retries after Retry-After, refused too
                lambda: (
                    len(client.answered("/v1/reward", down_at, 503)) >= 5
                    and len(client.answered("/v1/select", down_at, 503)) >= 5
                    and any(c.attempt >= 2 for c in client.answered("/v1/reward", down_at, 503))
                ),
                "503s to the client during the outage",
                timeout=30,
            )
            up_at = time.monotonic()
            private_postgres.start()
            restarted_at = time.monotonic()
            wait_for(lambda: http.get("/readyz").status_code == 200, "ready again", 30, 0.05)
            ready_s = time.monotonic() - restarted_at
            wait_for(
                lambda: client.answered("/v1/reward", restarted_at),
                "rewards acknowledged again",
                30,
            )
            recovered_s = time.monotonic() - restarted_at
            wait_for(lambda: client.answered("/v1/select", restarted_at), "decisions again", 30)
            seed_checkpoint(settings, n_rows=50)  # stored without a bus notice: polled for
            wait_for(lambda: model(http)["version"] == 1, "the checkpoint poll still running", 30)
            client.pause(drain=True)  # every owed reward and every retry acknowledged
            client.halt()

    assert healthz == 200
    assert readyz.status_code == 503, readyz.text
    assert readyz.json()["checks"]["database"] == "unreachable"
    for reply in refused:
        assert reply.status_code == 503, reply.text
        assert (reply.headers.get("retry-after") or "").isdigit(), reply.headers
    calls = client.calls
    assert_statuses(calls, {200, 503})  # never a 500, never a lost connection
    outage = [c for c in calls if c.started >= down_at and c.ended <= up_at]
    assert outage
    assert all(c.status == 503 for c in outage), [c for c in outage if c.status != 503]

    rewards = query(database, "select event_id, value from rewards")
    counts = Counter(event_id for event_id, _ in rewards)
    assert not [e for e, n in counts.items() if n != 1], "a reward stored twice"
    stored = dict(rewards)
    assert stored == client.acked, "stored rewards differ from the acknowledged ones"
    assert set(client.acked) >= {event_id for event_id, _ in owed}, "an owed reward never acked"
    assert not set(stored) & {event_id for event_id, _ in abandoned}, "a refused reward stored"
    decisions = dict(query(database, "select event_id, arm_id from decisions"))
    assert "lost" not in decisions, "a refused decision stored"
    assert all(decisions.get(e) == arm for e, (arm, _) in client.decided.items())
    answered = Counter(c.status for c in calls)
    print(
        f"\npostgres outage: {len(outage)} client requests during the outage, all 503 with "
        f"Retry-After ({answered[503]} 503s overall, {answered[200]} 200s); /healthz "
        f"{healthz}, /readyz {readyz.status_code} while down; ready {ready_s:.1f}s and the "
        f"client's rewards acknowledged {recovered_s:.1f}s after the restart; "
        f"{len(stored)} rewards stored, each once, as acknowledged; "
        f"{len(abandoned)} refused and never retried, none stored"
    )


# 3. The trainer ---------------------------------------------------------------------------


def test_trainer_killed_mid_fit_leaves_the_served_model_and_a_new_one_resumes(database, logs):
    env = service_env(database, require_redis())
    rng = random.Random(3)
    with (
        service_process(env, logs("api")) as base_url,
        httpx.Client(base_url=base_url, headers=AUTH, timeout=10) as http,
    ):
        for _ in range(30):
            context = [round(rng.gauss(0.0, 1.0), 4) for _ in range(DIM)]
            chosen = http.post("/v1/select", json={"context": context})
            assert chosen.status_code == 200, chosen.text
            event_id = chosen.json()["event_id"]
            reward = http.post("/v1/reward", json={"event_id": event_id, "value": rng.random()})
            assert reward.status_code == 200, reward.text
        once = subprocess.run(
            [sys.executable, "-m", "rofu.service.cli", "trainer", "--once"],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert once.returncode == 0, once.stdout + once.stderr
        wait_for(lambda: model(http)["version"] == 1, "the API serving checkpoint 1")
        served_before = model(http)
        [first] = http.get("/v1/model/checkpoints").json()

        with running_client(base_url, "kill") as client:
            wait_for(lambda: len(client.acked) >= 10, "new decisions and rewards")
            slow_log = logs("trainer-slow")
            slow_env = {"ROFU_FIT_STEPS": "10000000", "ROFU_FIT_BATCH_SIZE": "4096"}
            with trainer_process(env, slow_log, **slow_env) as slow:
                wait_for(
                    lambda: (
                        slow.poll() is not None or "training checkpoint 2" in slow_log.read_text()
                    ),
                    "the slow trainer starting checkpoint 2",
                )
                assert slow.poll() is None, "the slow trainer exited"
                slow.kill()
                slow.wait(10)
                killed_at = time.monotonic()
            assert slow.returncode == -signal.SIGKILL
            wait_for(lambda: len(client.answered("/v1/select", killed_at)) >= 10, "traffic after")
            client.pause(drain=True)  # a quiet database: the resumed run's rows are known

            served_after = model(http)
            listed_after = http.get("/v1/model/checkpoints").json()
            stored_after = stored_versions(database)
            marks = dict(query(database, "select trained_in, count(*) from decisions group by 1"))
            untrained = marks.get(None, 0)
            rewarded_untrained = query(
                database,
                "select count(*) from decisions d join rewards r using (event_id)"
                " where d.trained_in is null",
            )[0][0]
            pointer = redis.Redis.from_url(env["ROFU_REDIS_URL"])
            try:
                published = pointer.get(f"{env['ROFU_REDIS_PREFIX']}:checkpoint:latest")
            finally:
                pointer.close()

            with trainer_process(env, logs("trainer")):
                wait_for(lambda: model(http)["version"] >= 2, "the API serving checkpoint 2")
                listed = http.get("/v1/model/checkpoints").json()
                client.resume()
                resumed_at = time.monotonic()
                wait_for(
                    lambda: len(client.answered("/v1/select", resumed_at)) >= 5, "traffic on v2"
                )
                client.halt()
        second_blob = query(database, "select blob from checkpoints where version = 2")[0][0]
        marks_done = dict(query(database, "select trained_in, count(*) from decisions group by 1"))

    # The kill left nothing behind: the served model, the stored and published ones are v1.
    assert (served_after["version"], served_after["checksum"]) == (1, served_before["checksum"])
    assert [c["version"] for c in listed_after] == [1]
    assert stored_after == [1]
    assert published == b"1"
    assert marks.get(1) == 30, marks
    assert set(marks) == {1, None}, marks  # nothing marked by the killed run
    assert untrained > 0
    assert rewarded_untrained == untrained
    during = [c for c in client.calls if c.path == "/v1/select" and c.ended < resumed_at]
    assert_statuses(client.calls, {200})
    assert {c.version for c in during} == {1}
    # The new trainer resumed from v1: v2 holds v1's rows plus exactly the new ones.
    by_version = {c["version"]: c for c in listed}
    second = by_version[2]
    assert sorted(by_version) == [1, 2]
    assert second["rows_trained"] == untrained
    assert second["n_total"] == first["n_total"] + untrained == 30 + untrained
    assert load_checkpoint(bytes(second_blob)).extra["parent_version"] == "1"
    assert marks_done.get(2) == untrained
    assert marks_done.get(1) == 30
    after = [c.version for c in client.calls if c.path == "/v1/select" and c.started >= resumed_at]
    assert after
    assert min(v or 0 for v in after) >= 2
    print(
        f"\ntrainer killed: SIGKILL while fitting v2 on {untrained} new rows; afterwards "
        f"checkpoints {stored_after}, API serving v{served_after['version']} (same checksum), "
        f"{len(during)} /select all 200 on v1; the new trainer stored v2 from v1 "
        f"(n_total {first['n_total']} -> {second['n_total']}), API served v2"
    )


# 4. An API replica ------------------------------------------------------------------------


def test_api_killed_and_restarted_is_ready_only_with_the_newest_checkpoint(database, logs):
    env = service_env(database, require_redis())
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    readyz: list[tuple[float, int | str]] = []  # every answer of the restarted API
    with (
        trainer_process(env, logs("trainer")),
        httpx.Client(base_url=base_url, headers=AUTH, timeout=10) as http,
        contextlib.ExitStack() as processes,
    ):
        first = spawn_api(env, logs("api-1"), port)
        processes.callback(stop_process, first)
        wait_until_ready(base_url, first)
        with running_client(base_url, "restart") as client:
            wait_for(
                lambda: newest_stored(database) >= 2 and model(http)["version"] >= 2,
                "two checkpoints, served",
            )
            first.kill()
            first.wait(10)
            killed_at = time.monotonic()
            wait_for(lambda: len(client.answered("/v1/select", killed_at, None)) >= 3, "refusals")
            client.pause()
            # No new decisions: once the trainer consumed the last ones the newest stays put.
            wait_for(lambda: untrained_decisions(database) == 0, "the trainer catching up")
            newest = newest_stored(database)
            checksum = query(
                database, "select checksum from checkpoints where version = %s", newest
            )

            second = spawn_api(env, logs("api-2"), port)
            processes.callback(stop_process, second)
            spawned_at = time.monotonic()
            deadline = spawned_at + 90
            while True:
                assert second.poll() is None, "the restarted API exited"
                assert time.monotonic() < deadline, f"not ready: {readyz[-5:]}"
                try:
                    answer = httpx.get(f"{base_url}/readyz", timeout=2)
                except httpx.TransportError as exc:
                    readyz.append((time.monotonic() - spawned_at, type(exc).__name__))
                    time.sleep(0.05)
                    continue
                readyz.append((time.monotonic() - spawned_at, answer.status_code))
                if answer.status_code == 200:
                    served = model(http)
                    break
                time.sleep(0.05)
            ready_at = time.monotonic()
            chosen = http.post("/v1/select", json={"context": [0.5] * DIM})
            client.resume()
            wait_for(lambda: len(client.answered("/v1/select", ready_at)) >= 10, "traffic again")
            client.halt()

    assert newest >= 2
    assert (served["version"], served["checksum"]) == (newest, checksum[0][0])
    assert chosen.status_code == 200, chosen.text
    assert (chosen.json()["model_version"], chosen.json()["policy"]) == (newest, "rofu")
    statuses = [status for _, status in readyz]
    assert statuses[-1] == 200
    assert all(s == 503 or isinstance(s, str) for s in statuses[:-1]), statuses
    calls = client.calls
    assert_statuses(calls, {200, None})
    lost = [c for c in calls if c.status is None]
    assert all(killed_at - 1 <= c.started and c.ended <= ready_at for c in lost), lost[:3]
    after = [c.version for c in calls if c.path == "/v1/select" and c.started >= ready_at]
    assert after
    assert min(v or 0 for v in after) >= newest, (
        "an older model (or a cold start) after the restart"
    )
    print(
        f"\napi killed: {len(lost)} client requests refused while it was down; restarted, "
        f"/readyz answers {Counter(statuses)} ({len(readyz)} polls over "
        f"{readyz[-1][0]:.1f}s); first 200 with v{served['version']} = newest stored; "
        f"{len(after)} /select after, versions >= v{newest}"
    )
