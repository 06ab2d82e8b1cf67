"""Restart safety with the real servers: a trainer killed mid-run, Redis going away."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from rofu.models import load_checkpoint
from rofu.service.db import repository
from rofu.service.db import rewards as reward_rows
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.settings import Settings
from tests.factories import decision_row
from tests.support import ROOT, app_client, eventually, private_redis, require_redis


def _log_decisions(sessions, prefix: str, n: int) -> None:
    for i in range(n):
        row = decision_row(
            f"{prefix}-{i}",
            [i / n, 1.0, -1.0],
            arm=f"arm-{i % 2}",
            slot=i % 2,
            candidates=["arm-0", "arm-1"],
            propensity=0.5,
        )
        repository.save_decision(sessions, row)
        reward_rows.attach_reward(sessions, f"{prefix}-{i}", float(i % 2))


def _trainer_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "ROFU_MODE": "production",
        "ROFU_GATE": "off",  # each checkpoint served once stored (test_gate_pg.py: the gate)
        "ROFU_DATABASE_URL": settings.database_url,
        "ROFU_REDIS_URL": settings.redis_url or "",
        "ROFU_REDIS_PREFIX": settings.redis_prefix,
        "ROFU_CONTEXT_DIM": "3",
        "ROFU_HIDDEN": "[8]",
        "ROFU_REWARD_WINDOW_SECONDS": "0",
        "ROFU_TRAINER_METRICS_PORT": "0",
        **extra,
    }


def _trainer_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rofu.service.cli", "trainer", *args]


def test_trainer_killed_mid_run_resumes_without_loss_or_duplicates(pg_clean, tmp_path):
    settings = Settings(
        database_url=pg_clean,
        redis_url=require_redis(),
        context_dim=3,
        hidden=(8,),
        redis_prefix=f"kill-{uuid.uuid4().hex[:8]}",
        reward_window_seconds=0.0,
        fit_steps=20,
    )
    engine = make_engine(pg_clean)
    sessions = session_factory(engine)
    bus = RedisBus(settings.redis_url, prefix=settings.redis_prefix)
    _log_decisions(sessions, "old", 20)
    Trainer(settings, sessions, CheckpointStore(sessions), bus).run_once()  # version 1
    _log_decisions(sessions, "new", 30)

    log_path = tmp_path / "trainer.log"
    with open(log_path, "wb") as log:  # a fit that cannot finish before the kill
        slow = subprocess.Popen(
            _trainer_command(),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_trainer_env(settings, ROFU_FIT_STEPS="10000000", ROFU_FIT_BATCH_SIZE="4096"),
        )
    deadline = time.monotonic() + 90
    while "training checkpoint 2" not in log_path.read_text() and time.monotonic() < deadline:
        assert slow.poll() is None, log_path.read_text()
        time.sleep(0.1)
    time.sleep(1.0)  # well inside the fit
    slow.kill()
    slow.wait()
    assert "training checkpoint 2" in log_path.read_text()
    assert repository.latest_checkpoint(sessions, with_blob=False).version == 1
    untrained = repository.closed_decisions(sessions, repository.utcnow(), 100)
    assert sorted(r.event_id for r in untrained) == sorted(f"new-{i}" for i in range(30))

    rerun = subprocess.run(
        _trainer_command("--once"),
        cwd=ROOT,
        env=_trainer_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr

    row, blob = CheckpointStore(sessions).latest()
    checkpoint = load_checkpoint(blob)
    assert (row.version, row.rows_trained, row.n_total) == (2, 30, 50)
    assert checkpoint.extra["parent_version"] == "1"  # resumed from theta_1, not scratch
    assert int(checkpoint.data.arm_counts.sum()) == 50
    with psycopg.connect(pg_clean) as connection:
        marks = dict(
            connection.execute(
                "select trained_in, count(*) from decisions group by trained_in"
            ).fetchall()
        )
    assert marks == {1: 20, 2: 30}
    bus.close()
    engine.dispose()


@pytest.mark.anyio
async def test_replica_keeps_serving_when_redis_drops_and_reconnects(pg_clean):
    with private_redis() as (redis_url, stop_redis, start_redis):
        settings = Settings(
            database_url=pg_clean,
            redis_url=redis_url,
            context_dim=3,
            hidden=(8,),
            reward_window_seconds=0.0,
            fit_steps=10,
            checkpoint_poll_seconds=3600.0,
        )
        engine = make_engine(pg_clean)
        sessions = session_factory(engine)
        trainer = Trainer(
            settings, sessions, CheckpointStore(sessions), RedisBus(redis_url, timeout_s=1.0)
        )
        served = lambda: app.state.runtime.holder.current  # noqa: E731
        async with app_client(settings) as (client, app):
            _log_decisions(sessions, "r1", 10)
            trainer.run_once()
            await eventually(lambda: served() is not None and served().version == 1)

            stop_redis()
            reply = await client.post("/v1/select", json={"context": [0.5, 0.5, 0.5]})
            assert (reply.status_code, reply.json()["model_version"]) == (200, 1)
            assert (await client.get("/readyz")).status_code == 200
            _log_decisions(sessions, "r2", 10)
            trainer.run_once()  # stored durably; the notice cannot be sent

            start_redis()  # the listener reconnects on its own and catches up
            await eventually(lambda: served().version == 2, timeout=30)
            _log_decisions(sessions, "r3", 10)
            trainer.run_once()  # a notice over the new connection
            await eventually(lambda: served().version == 3, timeout=15)
        engine.dispose()
