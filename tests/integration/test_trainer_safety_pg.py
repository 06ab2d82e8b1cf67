"""The trainer on the real Postgres and Redis: a corrupt checkpoint is quarantined and
training goes on from the newest valid one, the advisory lock admits one trainer at a
time, and two trainers forced into the issue's order never train a row twice."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from rofu.models import load_checkpoint
from rofu.service.db import repository
from rofu.service.db.engine import make_engine, session_factory
from rofu.service.db.trainer_lock import ADVISORY_KEY, AdvisoryLock, trainer_lock
from rofu.service.lifecycle.checkpoint_store import CheckpointStore
from rofu.service.lifecycle.redis_bus import RedisBus
from rofu.service.lifecycle.trainer import Trainer
from rofu.service.metrics import ServiceMetrics
from rofu.service.settings import Settings
from tests.support import app_client, eventually, require_redis
from tests.trainers import assert_trained_once, damage, force_interleaving, log_decisions, marks


@pytest.fixture
def settings(pg_clean) -> Settings:
    return Settings(
        database_url=pg_clean,
        redis_url=require_redis(),
        redis_prefix=f"safety-{uuid.uuid4().hex[:10]}",
        context_dim=4,
        hidden=(8,),
        reward_window_seconds=0.0,
        fit_steps=20,
        checkpoint_poll_seconds=3600.0,  # swaps come from the pub/sub notice
    )


@pytest.fixture
def parts(settings):
    engine = make_engine(settings.database_url)
    sessions = session_factory(engine)
    bus = RedisBus(settings.redis_url, prefix=settings.redis_prefix)
    metrics = ServiceMetrics()
    yield sessions, CheckpointStore(sessions, metrics=metrics), bus, metrics
    bus.close()
    engine.dispose()


def _served(app) -> int:
    current = app.state.runtime.holder.current
    return 0 if current is None else current.version


@pytest.mark.anyio
async def test_a_corrupt_newest_checkpoint_is_quarantined_and_training_goes_on(settings, parts):
    sessions, store, bus, metrics = parts
    trainer = Trainer(settings, sessions, store, bus, metrics)
    async with app_client(settings) as (client, app):
        for prefix in ("a", "b"):
            log_decisions(sessions, prefix, 10)
            trainer.run_once()
        await eventually(lambda: _served(app) == 2)
        damage(sessions, 2)  # the durable copy; Redis keeps an intact one
        log_decisions(sessions, "c", 6)

        third = trainer.run_once()
        assert (third.version, third.consumed) == (3, 6)
        assert metrics.checkpoints_quarantined._value.get() == 1
        row, blob = store.latest()
        assert (row.version, load_checkpoint(blob).extra["parent_version"]) == (3, "1")
        await eventually(lambda: _served(app) == 3)

        refused = await client.put("/v1/admin/pin", json={"version": 2})
        assert refused.status_code == 409
        assert "quarantined" in refused.json()["error"]["message"]
        pinned = await client.put("/v1/admin/pin", json={"version": 1})
        assert pinned.json() == {"pinned": 1, "serving": 1}
        fourth = trainer.run_once()  # v2's released decisions, while pinned
        assert (fourth.version, fourth.consumed) == (4, 10)
        assert trainer.run_once() is None
        unpinned = await client.delete("/v1/admin/pin")
        assert unpinned.json() == {"pinned": None, "serving": 4}

    assert metrics.checkpoints_quarantined._value.get() == 1  # found once, never retried
    assert marks(sessions) == {1: 10, 3: 6, 4: 10}
    assert repository.latest_checkpoint(sessions).n_total == 26
    async with app_client(settings) as (_, fresh):  # a replica starting now
        assert _served(fresh) == 4


def _first_report(trainer, seconds=10.0):
    """The trainer's first run that trains, polling as `rofu trainer` does: a closed
    connection's backend ends (and frees its advisory lock) a moment after the close."""
    deadline = time.monotonic() + seconds
    while (report := trainer.run_once()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return report


def test_the_advisory_lock_admits_one_trainer_and_dies_with_its_connection(settings, parts):
    sessions, store, bus, metrics = parts
    assert isinstance(trainer_lock(sessions), AdvisoryLock)
    trainer = Trainer(settings, sessions, store, bus, metrics)
    log_decisions(sessions, "a", 8)
    other = psycopg.connect(settings.database_url, autocommit=True)  # another trainer process
    other.execute("select pg_advisory_lock(%s)", (ADVISORY_KEY,))
    assert trainer.run_once() is None
    assert metrics.trainer_skipped.labels("locked")._value.get() == 1
    assert marks(sessions) == {None: 8}
    other.close()  # that process ends: its server backend releases the lock soon after
    assert _first_report(trainer).version == 1
    with AdvisoryLock(sessions).hold() as free:
        assert free  # released after the run
        with AdvisoryLock(sessions).hold() as second:
            assert not second


@pytest.mark.parametrize("a_ignores_the_lock", [False, True], ids=["locked", "claim"])
def test_two_trainers_in_the_issue_order_train_no_row_twice_on_postgres(
    settings, parts, monkeypatch, a_ignores_the_lock
):
    sessions, store, bus, _ = parts
    outcome = force_interleaving(
        settings, sessions, store, bus, monkeypatch, a_ignores_the_lock=a_ignores_the_lock
    )
    assert_trained_once(sessions, outcome)
    if a_ignores_the_lock:
        assert outcome.b is None
        assert outcome.metrics.trainer_skipped.labels("claim_lost")._value.get() == 1
    else:
        assert outcome.a is None
        assert outcome.b.version == 2


def test_a_run_with_nothing_to_train_on_stores_no_version_on_postgres(settings, parts):
    sessions, store, bus, metrics = parts
    trainer = Trainer(settings, sessions, store, bus, metrics)
    log_decisions(sessions, "paid", 6)
    assert trainer.run_once().version == 1
    log_decisions(sessions, "unpaid", 6, rewarded=False)
    report = trainer.run_once()
    assert (report.version, report.excluded, report.loss) == (1, 6, None)
    assert [row.version for row in repository.list_checkpoints(sessions)] == [1]
    assert bus.latest_version() == 1
    assert marks(sessions) == {1: 12}
