"""Redis is a fast path, the database the truth: real `rofu trainer` and `rofu serve`
processes on Postgres while Redis is down from the start, or frozen (SIGSTOP).

1. A trainer started with nothing listening at its Redis URL trains, stores checkpoints
   that the replica loads through the database, outlives its start-up timeout, and
   publishes again once a Redis answers on that port.
2. With Redis frozen, each publish and each catalogue change waits at most about
   ROFU_REDIS_TIMEOUT_SECONDS (then Redis is skipped for a cool-down), never the 5 s a
   socket used to wait; the replica follows the trainer through the database meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_faults import (
    ADMIN_KEY,
    AUTH,
    assert_statuses,
    metric,
    model,
    newest_stored,
    running_client,
    service_env,
    trainer_process,
    wait_for,
)
from tests.support import free_port, private_redis, service_process

BOUND_S = 2.0  # the longest a call may wait on a frozen Redis: several times its timeout
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def redis_pointer(url: str, prefix: str) -> int | None:
    """The checkpoint pointer on Redis (None: unset or Redis down)."""
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        value = client.get(f"{prefix}:checkpoint:latest")
    except redis.RedisError:
        return None
    finally:
        client.close()
    return None if value is None else int(value)


def slow_runs(port: int, seconds: str = "2.5") -> float:
    """Training runs (fit, store and publish) that took longer than `seconds` (a bucket
    bound of rofu_trainer_duration_seconds), from the trainer's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    samples = {
        (sample.name, sample.labels.get("le")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if family.name == "rofu_trainer_duration_seconds"
    }
    total = samples[("rofu_trainer_duration_seconds_count", None)]
    return total - samples[("rofu_trainer_duration_seconds_bucket", seconds)]


@contextlib.contextmanager
def frozen(url: str) -> Iterator[None]:
    """The Redis server at `url` stopped with SIGSTOP for the block: connections are
    accepted by the kernel, and nothing ever answers."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_trainer_started_with_redis_down_trains_and_the_replica_loads_from_the_database(
    database: str, logs: Callable[[str], Path]
) -> None:
    port, metrics_port = free_port(), free_port()
    env = service_env(
        database,
        f"redis://127.0.0.1:{port}/0",  # nothing listens there yet
        ROFU_STARTUP_TIMEOUT_SECONDS="2",  # what the trainer once waited for Redis
        ROFU_TRAINER_METRICS_PORT=str(metrics_port),
    )
    trainer_log = logs("trainer")
    with (
        trainer_process(env, trainer_log) as trainer,
        service_process(env, logs("api")) as base_url,
        httpx.Client(base_url=base_url, headers=AUTH, timeout=10) as http,
        running_client(base_url, "down", pace_s=0.05) as client,
    ):
        wait_for(lambda: model(http)["version"] >= 2, "the replica loading checkpoints", 90)
        alive_without_redis = trainer.poll() is None
        stored_down = newest_stored(database)
        failures_down = metric(metrics_port, "rofu_trainer_publish_failures_total")
        with private_redis(port) as (redis_url, _, _):
            published = wait_for(
                lambda: (redis_pointer(redis_url, env["ROFU_REDIS_PREFIX"]) or 0) > stored_down,
                "a checkpoint published once Redis answers",
            )
        client.halt()
        alive_at_end = trainer.poll() is None

    assert alive_without_redis, "the trainer exited without Redis"
    assert alive_at_end
    assert failures_down >= 2  # each checkpoint stored while Redis was down
    assert published
    assert_statuses(client.calls, {200})
    assert "Redis does not answer; training anyway" in trainer_log.read_text()


def test_frozen_redis_costs_publishes_and_arm_changes_a_bounded_wait(
    database: str, logs: Callable[[str], Path]
) -> None:
    metrics_port = free_port()
    with private_redis() as (redis_url, _, _):
        env = service_env(
            database,
            redis_url,
            ROFU_MAX_ARMS="8",  # room for the arms added while Redis is frozen
            ROFU_TRAINER_METRICS_PORT=str(metrics_port),
        )
        with (
            trainer_process(env, logs("trainer")) as trainer,
            service_process(env, logs("api")) as base_url,
            httpx.Client(base_url=base_url, headers=AUTH, timeout=30) as http,
            running_client(base_url, "frozen", pace_s=0.05) as client,
        ):
            wait_for(lambda: model(http)["version"] >= 2, "the replica following the trainer")
            slow_before = slow_runs(metrics_port)
            failures_before = metric(metrics_port, "rofu_trainer_publish_failures_total")
            with frozen(redis_url):
                serving_at_freeze = model(http)["version"]
                arm_calls = []
                for i in range(3):
                    started = time.monotonic()
                    reply = http.post("/v1/arms", json={"id": f"frozen-{i}"}, headers=ADMIN)
                    arm_calls.append((reply.status_code, time.monotonic() - started))
                wait_for(
                    lambda: (
                        metric(metrics_port, "rofu_trainer_publish_failures_total")
                        >= failures_before + 3
                    ),
                    "publishes failing against the frozen Redis",
                )
                slow_frozen = slow_runs(metrics_port)
                wait_for(
                    lambda: model(http)["version"] > serving_at_freeze,
                    "the replica following the trainer through the database",
                )
            client.halt()
            assert trainer.poll() is None

    assert [status for status, _ in arm_calls] == [201] * 3
    assert max(seconds for _, seconds in arm_calls) < BOUND_S, arm_calls
    assert slow_frozen == slow_before, "a training run waited on the frozen Redis"
    assert_statuses(client.calls, {200})
