"""A corrupt newest checkpoint, with real processes and a real HTTP client on both
back-ends: SQLite embedded (checkpoint files in ROFU_CHECKPOINT_DIR, the trainer in the
API process) and Postgres + Redis (blobs in the rows, `rofu trainer` on its own).

While the client keeps deciding and rewarding, the newest checkpoint's stored bytes are
damaged. The trainer quarantines it (recorded, counted, logged) and trains the next
version from the newest valid one; the API answers every request (never a 500) and
follows; pinning the damaged version is refused and pinning a valid one works; a
restarted API is ready at once on the newest valid checkpoint and never reads the damaged
one again; every acknowledged reward is stored exactly once.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from rofu.models import load_checkpoint
from rofu.service import migrate
from tests.e2e.test_faults import (
    ADMIN_KEY,
    AUTH,
    Client,
    assert_statuses,
    metric,
    model,
    query,
    running_client,
    scratch_database,
    service_env,
    trainer_process,
    wait_for,
)
from tests.support import free_port, require_postgres, require_redis, service_process

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SLOWEST_S = 10.0  # a generous bound on one request, on a loaded shared machine


class Store:
    """The test's own reads and writes of the service's database, on either back-end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite:///")

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of one query (`%s` placeholders)."""
        if not self.sqlite:
            return query(self.url, sql, *params)
        with contextlib.closing(sqlite3.connect(self.url[len("sqlite:///") :], timeout=30)) as db:
            return db.execute(sql.replace("%s", "?"), params).fetchall()

    def newest(self) -> int:
        """The newest stored version, quarantined or not (0: none)."""
        return int(self.rows("select coalesce(max(version), 0) from checkpoints")[0][0])

    def untrained(self) -> int:
        """Decisions no run has consumed yet."""
        return int(self.rows("select count(*) from decisions where trained_in is null")[0][0])

    def quarantined(self) -> list[int]:
        """Quarantined versions."""
        sql = "select version from checkpoints where quarantined_at is not null order by 1"
        return [row[0] for row in self.rows(sql)]

    def blob(self, version: int) -> bytes:
        """A stored checkpoint's bytes, from its row or its file."""
        blob, path = self.rows("select blob, path from checkpoints where version = %s", version)[0]
        return Path(path).read_bytes() if path else bytes(blob)

    def damage(self, version: int) -> None:
        """Flip one bit inside the tensors of a stored checkpoint (header intact)."""
        damaged = bytearray(self.blob(version))
        damaged[-10] ^= 0x01
        path = self.rows("select path from checkpoints where version = %s", version)[0][0]
        if path:
            Path(path).write_bytes(bytes(damaged))
        elif self.sqlite:
            raise AssertionError("the embedded test keeps its checkpoints in files")
        else:
            with psycopg.connect(self.url) as connection:
                sql = "update checkpoints set blob = %s where version = %s"
                connection.execute(sql, (bytes(damaged), version))


def api_metric(http: httpx.Client, name: str) -> float:
    """A series of the API's /metrics, its labelled samples summed (0 when it has none)."""
    return sum(
        float(line.split()[-1])
        for line in http.get("/metrics").text.splitlines()
        if line.startswith((f"{name} ", f"{name}{{"))
    )


def settle(client: Client, store: Store, http: httpx.Client) -> int:
    """Stop new traffic, let the trainer consume every decision, and return the newest
    version once the API serves it."""
    client.pause(drain=True)
    wait_for(lambda: store.untrained() == 0, "the trainer consuming every decision", 120)
    newest = store.newest()
    wait_for(lambda: model(http)["version"] == newest, f"the API serving v{newest}", 60)
    return newest


def corrupt_and_recover(
    store: Store, http: httpx.Client, client: Client, trainer_quarantined: Callable[[], float]
) -> tuple[int, int]:
    """Damage the newest checkpoint, then wait for the trainer to quarantine it and train
    and the API to serve a newer one. Returns (the damaged version, the one served)."""
    wait_for(lambda: store.newest() >= 2, "two checkpoints", 180)
    damaged = settle(client, store, http)
    store.damage(damaged)
    client.resume()
    wait_for(lambda: store.quarantined() == [damaged], f"v{damaged} quarantined", 120)
    wait_for(lambda: trainer_quarantined() == 1, "the quarantine counted", 30)
    wait_for(lambda: store.newest() > damaged, "training resumed", 120)
    wait_for(lambda: model(http)["version"] > damaged, "the API following", 60)
    resumed = settle(client, store, http)
    extra = load_checkpoint(store.blob(damaged + 1)).extra
    assert extra["parent_version"] == str(damaged - 1), extra  # the newest valid one
    return damaged, resumed


def check_pins(http: httpx.Client, damaged: int, newest: int) -> None:
    """Pinning the damaged version is refused; pinning a valid one works, and unpinning."""
    refused = http.put("/v1/admin/pin", json={"version": damaged}, headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert "quarantined" in refused.json()["error"]["message"]
    pinned = http.put("/v1/admin/pin", json={"version": damaged - 1}, headers=ADMIN)
    assert pinned.json() == {"pinned": damaged - 1, "serving": damaged - 1}, pinned.text
    unpinned = http.delete("/v1/admin/pin", headers=ADMIN)
    assert unpinned.json() == {"pinned": None, "serving": newest}, unpinned.text


def check_restart(
    env: dict[str, str], log: Path, port: int, store: Store, newest: int
) -> dict[str, float]:
    """A new API process on the same store: ready on the newest valid checkpoint at once,
    without reading the quarantined one (nothing refused, nothing quarantined)."""
    with (
        service_process(env, log, port) as base_url,
        httpx.Client(base_url=base_url, headers=AUTH, timeout=SLOWEST_S) as http,
    ):
        ready = http.get("/readyz")
        served = model(http)["version"]
        return {
            "readyz": ready.status_code,
            "served": served,
            "rejected": api_metric(http, "rofu_checkpoint_rejected_total"),
            "quarantined": api_metric(http, "rofu_checkpoints_quarantined_total"),
        }


def check_calls(client: Client, store: Store) -> Counter[int | None]:
    """No 500, no lost connection, every request answered within the bound, and every
    acknowledged reward stored exactly once."""
    calls = client.calls
    assert_statuses(calls, {200})
    slow = [c for c in calls if c.ended - c.started > SLOWEST_S]
    assert not slow, slow[:3]
    rewards = store.rows("select event_id, value from rewards")
    counts = Counter(event_id for event_id, _ in rewards)
    assert not [e for e, n in counts.items() if n != 1], "a reward stored twice"
    assert dict(rewards) == client.acked, "stored rewards differ from the acknowledged ones"
    return Counter(c.status for c in calls)


def test_corrupt_newest_checkpoint_embedded_sqlite_recovers(tmp_path, logs):
    url = f"sqlite:///{tmp_path}/rofu.sqlite"
    env = service_env(
        url, "", ROFU_MODE="embedded", ROFU_CHECKPOINT_DIR=str(tmp_path / "checkpoints")
    )
    del env["ROFU_REDIS_URL"], env["ROFU_REDIS_PREFIX"]
    store, port, api_log = Store(url), free_port(), logs("api")
    with (
        service_process(env, api_log, port) as base_url,
        httpx.Client(base_url=base_url, headers=AUTH, timeout=SLOWEST_S) as http,
        running_client(base_url, "embedded") as client,
    ):
        counted = lambda: api_metric(http, "rofu_checkpoints_quarantined_total")  # noqa: E731
        damaged, newest = corrupt_and_recover(store, http, client, counted)
        ready = http.get("/readyz")
        check_pins(http, damaged, newest)
        failures = api_metric(http, "rofu_trainer_failures_total")
        client.halt()
    restarted = check_restart(env, logs("api-restarted"), port, store, newest)
    answered = check_calls(client, store)

    assert (ready.status_code, ready.json()["checks"]["model"]) == (200, "loaded")
    assert failures == 0
    assert restarted == {"readyz": 200, "served": newest, "rejected": 0, "quarantined": 0}
    assert store.quarantined() == [damaged]
    assert f"checkpoint {damaged} quarantined" in api_log.read_text()
    print(
        f"\nembedded corrupt checkpoint: v{damaged} quarantined, training resumed from "
        f"v{damaged - 1} (served v{newest}), /readyz 200 throughout and after a restart; "
        f"{answered[200]} requests, all 200; {len(client.acked)} rewards stored once each"
    )


def test_corrupt_newest_checkpoint_postgres_redis_recovers(logs):
    with scratch_database(require_postgres()) as url:
        migrate.upgrade(url)
        env = service_env(url, require_redis())
        store, port, metrics_port = Store(url), free_port(), free_port()
        trainer_log = logs("trainer")
        counted = lambda: metric(metrics_port, "rofu_checkpoints_quarantined_total")  # noqa: E731
        with trainer_process(env, trainer_log, ROFU_TRAINER_METRICS_PORT=str(metrics_port)):
            with (
                service_process(env, logs("api"), port) as base_url,
                httpx.Client(base_url=base_url, headers=AUTH, timeout=SLOWEST_S) as http,
                running_client(base_url, "postgres") as client,
            ):
                damaged, newest = corrupt_and_recover(store, http, client, counted)
                ready = http.get("/readyz")
                check_pins(http, damaged, newest)
                client.resume()
                wait_for(lambda: store.newest() > newest, "the trainer training on", 120)
                newest = settle(client, store, http)
                client.halt()
            trainer = {
                name: metric(metrics_port, f"rofu_{name}_total")
                for name in ("checkpoints_quarantined", "trainer_failures")
            }
            restarted = check_restart(env, logs("api-restarted"), port, store, newest)
        answered = check_calls(client, store)

    assert (ready.status_code, ready.json()["checks"]["model"]) == (200, "loaded")
    assert trainer == {"checkpoints_quarantined": 1, "trainer_failures": 0}  # never retried
    assert restarted == {"readyz": 200, "served": newest, "rejected": 0, "quarantined": 0}
    assert f"checkpoint {damaged} quarantined" in trainer_log.read_text()
    print(
        f"\npostgres corrupt checkpoint: v{damaged} quarantined once by the trainer, "
        f"training resumed from v{damaged - 1} up to v{newest}; {answered[200]} requests, "
        f"all 200; {len(client.acked)} rewards stored once each"
    )
